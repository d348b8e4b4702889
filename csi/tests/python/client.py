"""A CSI client in a second gRPC implementation (Python grpcio), for csi/tests/sanity/python.rs.

Usage: client.py STUB_DIR SOCKET WORK_DIR. Calls every service of the driver over
unix://SOCKET without setting the authority (grpcio then sends its own default), and prints one
JSON object with what each call returned. Any failed call raises, so the exit status is not 0.
"""

import json
import os
import sys

stub_dir, socket, work = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, stub_dir)

import grpc  # noqa: E402
import csi_pb2 as pb  # noqa: E402
import csi_pb2_grpc as rpc  # noqa: E402

out = {}
with grpc.insecure_channel("unix://" + socket) as channel:
    identity = rpc.IdentityStub(channel)
    controller = rpc.ControllerStub(channel)
    node = rpc.NodeStub(channel)

    info = identity.GetPluginInfo(pb.GetPluginInfoRequest(), timeout=30)
    out["driver"] = info.name
    out["ready"] = identity.Probe(pb.ProbeRequest(), timeout=30).ready.value
    out["plugin_capabilities"] = len(
        identity.GetPluginCapabilities(pb.GetPluginCapabilitiesRequest(), timeout=30).capabilities
    )

    cap = pb.VolumeCapability(
        mount=pb.VolumeCapability.MountVolume(),
        access_mode=pb.VolumeCapability.AccessMode(
            mode=pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
        ),
    )
    created = controller.CreateVolume(
        pb.CreateVolumeRequest(
            name="py-vol",
            capacity_range=pb.CapacityRange(required_bytes=1 << 20),
            volume_capabilities=[cap],
        ),
        timeout=30,
    ).volume
    out["created"] = [created.volume_id, created.capacity_bytes]
    out["listed"] = [
        e.volume.volume_id
        for e in controller.ListVolumes(pb.ListVolumesRequest(), timeout=30).entries
    ]
    out["controller_capabilities"] = len(
        controller.ControllerGetCapabilities(
            pb.ControllerGetCapabilitiesRequest(), timeout=30
        ).capabilities
    )

    out["node_id"] = node.NodeGetInfo(pb.NodeGetInfoRequest(), timeout=30).node_id
    out["node_capabilities"] = len(
        node.NodeGetCapabilities(pb.NodeGetCapabilitiesRequest(), timeout=30).capabilities
    )
    if os.geteuid() == 0:
        target = os.path.join(work, "py-target")
        node.NodePublishVolume(
            pb.NodePublishVolumeRequest(
                volume_id="py-vol", target_path=target, volume_capability=cap
            ),
            timeout=30,
        )
        with open(os.path.join(target, "hello"), "w") as f:
            f.write("from python")
        node.NodeUnpublishVolume(
            pb.NodeUnpublishVolumeRequest(volume_id="py-vol", target_path=target), timeout=30
        )
        out["published"] = True

    controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id="py-vol"), timeout=30)
    out["deleted"] = True

print(json.dumps(out))
