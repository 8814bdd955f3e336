"""The catalogues the submission rules read: images, volumes, public data, pools.

Images, volumes and public data are loaded from the gateway's config file
(`Catalogue.from_dict` takes the parsed YAML) and changed through the admin
API (`with_image`, `with_volume`, `with_public_data` return a new catalogue).
Pools and their worker specs come from the scheduler's read model as
`PoolView`s. All models are frozen: a rule never changes what it reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from runyard.contracts.spec import ResourceType

#: The image service that training tasks need (可用服务 includes 任务).
TRAINING_SERVICE = "training"
#: Where public data is mounted, read-only, in zones that have it.
PUBLIC_DATA_PATH = "/infini-data/"
#: GPUs per worker that a predefined worker spec may have (R-02).
SPEC_GPU_SIZES = frozenset({1, 2, 4, 8})

Network = Literal["roce", "ib", "ethernet"]


#: A file system, volume or zone name: one path component that cannot leave the
#: volumes root on a host (no `/`, no `..`, no leading `.`), at most 128 characters.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
#: An image reference: registry, repository, tag or digest characters.
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,511}$"



def _one_component(name: str) -> str:
    if not re.fullmatch(NAME_PATTERN, name):
        raise ValueError(
            f"{name[:80]!r} is not a name: use 1 to 128 letters, digits, `.`, `_` or `-`, "
            "starting with a letter or digit (no `/`, no `..`)"
        )
    return name


Name = Annotated[
    str, AfterValidator(_one_component), Field(json_schema_extra={"pattern": NAME_PATTERN})
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Image(_Frozen):
    """A container image: the zones it is in and the services it is available to."""

    name: str = Field(pattern=IMAGE_PATTERN)
    zones: tuple[Name, ...] = Field(default=(), max_length=64)
    #: Available services, e.g. `training`, `dev_machine`, `inference`.
    services: tuple[Name, ...] = Field(default=(), max_length=16)


class Volume(_Frozen):
    """A high-performance volume of one zone (file system + volume name).

    The names become a directory on the hosts (under the volumes root), so
    they are single path components (`NAME_PATTERN`)."""

    file_system: Name
    volume: Name
    zone: Name


class PublicData(_Frozen):
    """Read-only public models and data sets, offered in one zone."""

    zone: Name
    path: str = Field(default=PUBLIC_DATA_PATH, pattern=r"^/[^\x00]{0,1023}$")


class Catalogue(_Frozen):
    """Images, volumes and public data known to the platform."""

    images: tuple[Image, ...] = ()
    volumes: tuple[Volume, ...] = ()
    public_data: tuple[PublicData, ...] = ()

    @model_validator(mode="after")
    def _unique_images(self) -> Catalogue:
        names = [image.name for image in self.images]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"image names must be unique: {', '.join(duplicates)}")
        return self

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Catalogue:
        """Load a catalogue from its config-file shape (`images`, `volumes`, `public_data`)."""
        return cls.model_validate(dict(data))

    def image(self, name: str) -> Image | None:
        """The image called `name`, if known."""
        return next((image for image in self.images if image.name == name), None)

    def volumes_named(self, file_system: str, volume: str) -> tuple[Volume, ...]:
        """Every volume with this file system and name, whatever its zone."""
        return tuple(v for v in self.volumes if (v.file_system, v.volume) == (file_system, volume))

    def public_data_in(self, zone: str) -> PublicData | None:
        """The public data offered in `zone`, if any."""
        return next((p for p in self.public_data if p.zone == zone), None)

    def public_data_zones(self) -> tuple[str, ...]:
        """Zones that offer public data, sorted."""
        return tuple(sorted({p.zone for p in self.public_data}))

    def with_image(self, image: Image) -> Catalogue:
        """A copy with `image` added, or replacing the image of the same name."""
        others = tuple(i for i in self.images if i.name != image.name)
        return self.model_copy(update={"images": (*others, image)})

    def with_volume(self, volume: Volume) -> Catalogue:
        """A copy with `volume` added (a no-op if it is already there)."""
        if volume in self.volumes:
            return self
        return self.model_copy(update={"volumes": (*self.volumes, volume)})

    def with_public_data(self, public_data: PublicData) -> Catalogue:
        """A copy with public data offered in `public_data.zone`."""
        others = tuple(p for p in self.public_data if p.zone != public_data.zone)
        return self.model_copy(update={"public_data": (*others, public_data)})


class PoolView(_Frozen):
    """What the rules need to know of a resource pool (from the scheduler's read model)."""

    pool_id: str = Field(min_length=1)
    zone: str = Field(min_length=1)
    resource_type: ResourceType
    #: The training network; RDMA needs `roce` or `ib` (R-09).
    network: Network
    #: Predefined worker specs: name -> GPUs per worker (1, 2, 4 or 8).
    specs: dict[str, int]
    #: All GPUs of the pool's nodes; a task needing more can never start. None: unknown.
    total_gpus: int | None = Field(default=None, ge=0)

    @field_validator("specs")
    @classmethod
    def _spec_sizes(cls, specs: dict[str, int]) -> dict[str, int]:
        wrong = {name: gpus for name, gpus in specs.items() if gpus not in SPEC_GPU_SIZES}
        if wrong:
            raise ValueError(f"worker specs must have 1, 2, 4 or 8 GPUs, not {wrong}")
        return specs
