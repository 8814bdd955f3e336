"""What a task may use: the catalogue (images, volumes, public data) and pools.

The submission service owns the catalogue: it loads `catalogue.yaml`
(`Catalogue.from_dict` takes the parsed YAML) and applies the admin API's
changes (`with_entry`). Pools and their worker specs come from the
scheduler's read model as `PoolView`s (`pool_view_of` reads either shape).
The gateway shows both and publishes the entries' schemas, so the models live
here, shared. All models are frozen: a rule never changes what it reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
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


CatalogueEntry: TypeAlias = Image | Volume | PublicData
#: The kinds of entry the admin API changes, by the name events and tables use.
ENTRY_KINDS: dict[str, type[Image] | type[Volume] | type[PublicData]] = {
    "image": Image,
    "volume": Volume,
    "public_data": PublicData,
}


def entry_key(entry: CatalogueEntry) -> tuple[str, str]:
    """The (kind, key) an admin change is stored under: a later change replaces it."""
    if isinstance(entry, Image):
        return "image", entry.name
    if isinstance(entry, Volume):
        return "volume", f"{entry.file_system}/{entry.volume}/{entry.zone}"
    return "public_data", entry.zone


def with_entry(catalogue: Catalogue, entry: CatalogueEntry) -> Catalogue:
    """The catalogue with one admin change applied."""
    if isinstance(entry, Image):
        return catalogue.with_image(entry)
    if isinstance(entry, Volume):
        return catalogue.with_volume(entry)
    return catalogue.with_public_data(entry)


def pool_view_of(raw: Mapping[str, Any]) -> PoolView | None:
    """The rules' view of a pool from the scheduler's read model or `pools.yaml` (both
    shapes: `id` or `pool_id`, specs as a mapping or a list); None for an entry the
    rules cannot use."""
    specs = raw.get("specs") or {}
    if isinstance(specs, list):
        specs = {s["name"]: s["gpus"] for s in specs if isinstance(s, dict)}
    try:
        return PoolView(
            pool_id=raw.get("pool_id") or raw.get("id"),
            zone=raw.get("zone"),
            resource_type=raw.get("resource_type", "subscription"),
            network=raw.get("network", "ethernet"),
            specs=specs,
            total_gpus=raw.get("total_gpus", total_gpus(raw.get("nodes"))),
        )
    except ValidationError:
        return None


def total_gpus(nodes: Any) -> int | None:
    """All GPUs of a pool's nodes, from `{count, gpus}`, a list of nodes, or a node count."""
    if isinstance(nodes, dict) and isinstance(nodes.get("count"), int):
        return int(nodes["count"]) * int(nodes.get("gpus", 8))
    if isinstance(nodes, int):
        return nodes * 8
    if isinstance(nodes, list):
        return sum(int(n.get("gpus", 8)) if isinstance(n, dict) else 8 for n in nodes)
    return None
