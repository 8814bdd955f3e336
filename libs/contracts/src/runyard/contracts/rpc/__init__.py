"""Internal gRPC contracts between services, generated from proto/runyard/internal/v1.

Do not edit the `*_pb2*` modules: `make proto` regenerates them (see the Makefile).

`submission_pb2` / `submission_pb2_grpc`: the submission service's API, called by
the gateway (see the proto file for the credential and how a refusal is answered).
"""
