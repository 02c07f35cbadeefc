"""tpuhal-device-plugin against a kubelet stand-in (docs/operations.md).

Kubernetes' kubelet is not packaged by Debian, so this test plays its part
of the device plugin API v1beta1 with grpcio (Debian's python3-grpcio) on
the same .proto the plugin is built from: it serves Registration on
kubelet.sock, then calls the plugin's DevicePlugin service on the socket the
plugin registered, as the kubelet does. The boards are the simulator
daemon's; the fault is a firmware crash injected into its VFs."""
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from concurrent import futures

import pytest

BIN = os.environ.get("TPUHAL_BIN_DIR", "")
PLUGIN = os.path.join(BIN, "tpuhal-device-plugin")
SIMD = os.path.join(BIN, "tpuhal-simd")
PROTO = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools", "tpuhal-device-plugin", "deviceplugin.proto")

grpc = pytest.importorskip("grpc", reason="python3-grpcio plays the kubelet (scripts/setup.sh installs it)")


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """The API's messages, generated from the plugin's own .proto."""
    if not os.path.exists(PLUGIN):
        pytest.fail(f"{PLUGIN} was not built (it needs libgrpc++-dev and protobuf-compiler-grpc)")
    protoc = shutil.which("protoc")
    if protoc is None:
        pytest.fail("protoc is missing (Debian: protobuf-compiler; scripts/setup.sh installs it)")
    out = tmp_path_factory.mktemp("api")
    proto = os.path.abspath(PROTO)
    subprocess.run([protoc, f"--proto_path={os.path.dirname(proto)}", f"--python_out={out}", proto], check=True)
    sys.path.insert(0, str(out))
    import deviceplugin_pb2
    return deviceplugin_pb2


class Kubelet:
    """The kubelet's side: Registration on kubelet.sock, and a client of the
    plugin's socket once it registers."""

    def __init__(self, api, directory):
        self.api = api
        self.dir = directory
        self.registrations = queue.Queue()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler("v1beta1.Registration", {
            "Register": grpc.unary_unary_rpc_method_handler(
                self._register, request_deserializer=api.RegisterRequest.FromString,
                response_serializer=api.Empty.SerializeToString)})
        self.server.add_generic_rpc_handlers((handler,))
        sock = os.path.join(directory, "kubelet.sock")
        if os.path.exists(sock):
            os.unlink(sock)
        self.server.add_insecure_port(f"unix://{sock}")
        self.server.start()

    def _register(self, request, context):
        self.registrations.put(request)
        return self.api.Empty()

    def stop(self):
        self.server.stop(0).wait()

    def connect(self, endpoint):
        channel = grpc.insecure_channel(f"unix://{os.path.join(self.dir, endpoint)}")
        a = self.api

        def unary(name, req, resp):
            return channel.unary_unary(f"/v1beta1.DevicePlugin/{name}", request_serializer=req.SerializeToString,
                                       response_deserializer=resp.FromString)
        return channel, {
            "options": unary("GetDevicePluginOptions", a.Empty, a.DevicePluginOptions),
            "preferred": unary("GetPreferredAllocation", a.PreferredAllocationRequest, a.PreferredAllocationResponse),
            "allocate": unary("Allocate", a.AllocateRequest, a.AllocateResponse),
            "watch": channel.unary_stream("/v1beta1.DevicePlugin/ListAndWatch",
                                          request_serializer=a.Empty.SerializeToString,
                                          response_deserializer=a.ListAndWatchResponse.FromString),
        }


class Watch:
    """ListAndWatch's stream, read on a thread: every list the plugin sends."""

    def __init__(self, api, stub):
        self.lists = queue.Queue()
        self.call = stub["watch"](api.Empty())
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            for r in self.call:
                self.lists.put({d.ID: d for d in r.devices})
        except grpc.RpcError:
            pass

    def next(self, timeout=10):
        return self.lists.get(timeout=timeout)

    def until(self, pred, within):
        """The first list for which pred holds, and when it came."""
        deadline = time.monotonic() + within
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no list from the plugin met the condition within {within} s")
            try:
                devices = self.lists.get(timeout=left)
            except queue.Empty:
                continue
            if pred(devices):
                return devices, time.monotonic()

    def stop(self):
        self.call.cancel()
        self.thread.join(10)


def start(api, tmp_path, shares, numa=True):
    """A daemon with two tiny boards whose VFs' firmware crashes at their
    fourth command on compute queue 0, a kubelet stand-in, and the plugin
    advertising `shares` devices per board (board 1 on NUMA node 1 if
    `numa`)."""
    sock = str(tmp_path / "simd.sock")
    env = dict(os.environ, TPUHAL_SIM_FAULTS="crash:queue=0:after=3")
    daemon = subprocess.Popen([SIMD, "--socket", sock, "--board", "tiny", "--board", "tiny", "--vfs", "2"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert "serving" in daemon.stdout.readline()
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    kubelet = Kubelet(api, str(plugins))
    plugin = subprocess.Popen([PLUGIN, "--plugin-dir", str(plugins), "--shares", str(shares), "--health-interval-ms",
                               "100", *(["--numa", f"simd:{sock}#1=1"] if numa else []),
                               "--device", f"simd:{sock}#0", "--device", f"simd:{sock}#1"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return {"sock": sock, "dir": str(plugins), "kubelet": kubelet, "plugin": plugin, "daemon": daemon}


def stop(state):
    plugin, daemon = state["plugin"], state["daemon"]
    plugin.terminate()
    try:
        plugin.wait(10)
    except subprocess.TimeoutExpired:
        plugin.kill()
        plugin.wait()
    plugin.stdout.close()
    plugin.stderr.close()
    state["kubelet"].stop()
    if daemon.poll() is None:
        daemon.terminate()
        daemon.wait(10)
    daemon.stdout.close()


@pytest.fixture
def setup(api, tmp_path):
    state = start(api, tmp_path, shares=2)
    yield state
    stop(state)


def test_the_plugin_registers_lists_allocates_and_prefers_one_numa_node(api, setup):
    reg = setup["kubelet"].registrations.get(timeout=30)
    assert reg.version == "v1beta1" and reg.resource_name == "tpuhal.dev/board"
    assert reg.endpoint == "tpuhal.sock" and reg.options.get_preferred_allocation_available
    channel, stub = setup["kubelet"].connect(reg.endpoint)
    assert stub["options"](api.Empty(), timeout=10).get_preferred_allocation_available
    watch = Watch(api, stub)
    devices = watch.next()
    # Two boards, two shares each, healthy; board 1 on the NUMA node it was given.
    assert sorted(devices) == ["0-0", "0-1", "1-0", "1-1"]
    assert all(d.health == "Healthy" for d in devices.values())
    assert [n.ID for n in devices["1-0"].topology.nodes] == [1] and not devices["0-0"].topology.nodes

    # Allocate: the CDI devices, and the same edits for runtimes without CDI.
    req = api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(devices_ids=["0-1", "1-0", "1-1"])])
    r = stub["allocate"](req, timeout=10).container_responses[0]
    assert [c.name for c in r.cdi_devices] == ["tpuhal.dev/board=0", "tpuhal.dev/board=1"]
    sock = setup["sock"]
    assert dict(r.envs) == {"TPUHAL_VISIBLE_DEVICE_0": f"simd:{sock}#0", "TPUHAL_VISIBLE_DEVICE_1": f"simd:{sock}#1"}
    assert [(m.container_path, m.host_path, m.read_only) for m in r.mounts] == [(sock, sock, False)]
    with pytest.raises(grpc.RpcError) as e:
        stub["allocate"](api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(devices_ids=["7"])]),
                         timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown device ID '7'" in e.value.details()

    # Preferred allocation: two devices with one of board 1's shares required
    # stay on board 1's node; with nothing required, distinct boards first.
    def prefer(available, must, size):
        req = api.PreferredAllocationRequest(container_requests=[api.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size)])
        return list(stub["preferred"](req, timeout=10).container_responses[0].deviceIDs)
    assert prefer(["0-0", "0-1", "1-0", "1-1"], ["1-0"], 2) == ["1-0", "1-1"]
    assert prefer(["0-0", "0-1", "1-1"], [], 2) == ["0-0", "0-1"]  # node -1 has the most available
    assert sorted(prefer(["0-0", "1-0"], [], 2)) == ["0-0", "1-0"]
    with pytest.raises(grpc.RpcError):
        prefer(["0-0"], [], 2)
    watch.stop()
    channel.close()


def test_a_board_that_crashes_turns_unhealthy_within_a_second_and_healthy_after_a_reset(api, setup):
    import tpuhal
    reg = setup["kubelet"].registrations.get(timeout=30)
    channel, stub = setup["kubelet"].connect(reg.endpoint)
    watch = Watch(api, stub)
    assert all(d.health == "Healthy" for d in watch.next().values())
    dev = tpuhal.open(f"simd:{setup['sock']}#0")
    q = dev.queue("compute")
    assert q.index == 0
    buf = dev.alloc(4096)
    with pytest.raises(tpuhal.DeviceLost):
        for _ in range(10):
            q.fill(buf, 1).submit().wait()
    crashed = time.monotonic()
    # The plugin looks every 100 ms; how soon it tells depends on the machine's load, so the test waits for
    # the change (the bound is a timeout, not a figure) and prints how long it took.
    devices, when = watch.until(lambda ds: ds["0-0"].health == "Unhealthy", within=60)
    print(f"unhealthy {when - crashed:.3f} s after the crash was seen")
    assert devices["0-1"].health == "Unhealthy" and devices["1-0"].health == "Healthy"
    del q, buf
    dev.reset()
    devices, _ = watch.until(lambda ds: ds["0-0"].health == "Healthy", within=60)
    assert all(d.health == "Healthy" for d in devices.values())
    dev.close()
    watch.stop()
    channel.close()


def test_the_plugin_registers_again_when_the_kubelet_restarts(api, setup):
    assert setup["kubelet"].registrations.get(timeout=30).resource_name == "tpuhal.dev/board"
    # A restarting kubelet removes every socket in the directory and serves a new kubelet.sock.
    setup["kubelet"].stop()
    for name in os.listdir(setup["dir"]):
        os.unlink(os.path.join(setup["dir"], name))
    setup["kubelet"] = Kubelet(api, setup["dir"])
    reg = setup["kubelet"].registrations.get(timeout=30)
    assert reg.endpoint == "tpuhal.sock"
    channel, stub = setup["kubelet"].connect(reg.endpoint)
    deadline = time.monotonic() + 10
    while True:  # the plugin may still be bringing its new socket up
        try:
            assert stub["options"](api.Empty(), timeout=5).get_preferred_allocation_available
            break
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    watch = Watch(api, stub)
    assert len(watch.next()) == 4
    watch.stop()
    channel.close()


def test_a_dead_daemon_turns_its_boards_unhealthy_and_the_plugin_serves_on(api, setup):
    reg = setup["kubelet"].registrations.get(timeout=30)
    channel, stub = setup["kubelet"].connect(reg.endpoint)
    watch = Watch(api, stub)
    assert all(d.health == "Healthy" for d in watch.next().values())
    setup["daemon"].kill()
    setup["daemon"].wait()
    killed = time.monotonic()
    devices, when = watch.until(lambda ds: all(d.health == "Unhealthy" for d in ds.values()), within=60)
    print(f"unhealthy {when - killed:.3f} s after the daemon died")
    # Nothing hangs: the plugin still answers.
    r = stub["allocate"](api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(devices_ids=["0-0"])]),
                         timeout=10)
    assert [c.name for c in r.container_responses[0].cdi_devices] == ["tpuhal.dev/board=0"]
    assert setup["plugin"].poll() is None
    watch.stop()
    channel.close()


def test_a_huge_preferred_allocation_is_answered_in_one_pass_and_holds_up_no_allocation(api, tmp_path):
    """2,048 devices (1,024 shares of each board) and a request that lists
    one of them 2,000 more times: the repeat is refused by name, and an
    Allocate sent meanwhile is answered (GetPreferredAllocation holds no
    lock; its work is linear in the request). Asked for every device, the
    plugin answers with all of them, one board after the other."""
    state = start(api, tmp_path, shares=1024, numa=False)
    try:
        reg = state["kubelet"].registrations.get(timeout=30)
        channel, stub = state["kubelet"].connect(reg.endpoint)
        ids = [f"{b}-{k}" for b in (0, 1) for k in range(1024)]

        def request(available, must, size):
            return api.PreferredAllocationRequest(container_requests=[api.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size)])

        # Generous deadlines: they end a hang, they measure nothing.
        listed = ids + ["0-7"] * 2000
        repeated = stub["preferred"].future(request(listed, [], len(listed)), timeout=120)
        r = stub["allocate"](api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(
            devices_ids=["1-3", "1-4"])]), timeout=120)
        assert [c.name for c in r.container_responses[0].cdi_devices] == ["tpuhal.dev/board=1"]
        with pytest.raises(grpc.RpcError) as e:
            repeated.result()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "device ID '0-7' is listed twice in available_deviceIDs" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub["preferred"](request(ids, ["1-5", "1-5"], 4), timeout=120)
        assert "device ID '1-5' is listed twice in must_include_deviceIDs" in e.value.details()

        def prefer(available, must, size):
            return list(stub["preferred"](request(available, must, size), timeout=120).container_responses[0].deviceIDs)
        # Every device: a board not yet chosen before a second share of one that is, in the order listed.
        assert prefer(ids, [], len(ids)) == [f"{b}-{k}" for k in range(1024) for b in (0, 1)]
        # A required device counts for its board and is not chosen twice.
        assert prefer(ids, ["1-5"], 4) == ["1-5", "0-0", "0-1", "1-0"]
        channel.close()
    finally:
        stop(state)
