"""Our compiled copy of XProf's ``xplane.proto`` (Apache-2.0; see the header of xplane.proto).

``xplane_pb2.py`` is generated, and committed so that reading XPlane files needs only the
``protobuf`` package at run time (no TensorFlow, no protoc). To regenerate it after updating
``xplane.proto``::

    pip install grpcio-tools      # a dev tool only; it bundles protoc
    bash scripts/gen_xplane_proto.sh

The committed module was made with grpcio-tools 1.85.1 (libprotoc 35.1). The script removes
protoc's runtime-version check (the emitted code runs on every protobuf >= 3.20; xpuprof allows
>= 4.21) and registers the messages in a private descriptor pool, so that another copy of
``tensorflow.profiler.XSpace`` registered by TensorFlow or XProf in the same process cannot
clash with ours.
"""
