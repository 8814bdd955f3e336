"""Internal gRPC contracts between services, generated from proto/runyard/internal/v1.

Do not edit the `*_pb2*` modules: regenerate them from the repository root with

    python -m grpc_tools.protoc -Iproto --python_out=build/proto-internal \
        --pyi_out=build/proto-internal --grpc_python_out=build/proto-internal \
        proto/runyard/internal/v1/submission.proto
    for f in submission_pb2.py submission_pb2.pyi submission_pb2_grpc.py; do
        sed 's/^from runyard\\.internal\\.v1 import /from . import /' \
            build/proto-internal/runyard/internal/v1/$f > libs/contracts/src/runyard/contracts/rpc/$f; done

`submission_pb2` / `submission_pb2_grpc`: the submission service's API, called by
the gateway (see the proto file for the credential and how a refusal is answered).
"""
