"""Containers through the Container Device Interface (docs/operations.md):
`tpuhal cdi generate` for boards the simulator daemon shares, validated
against the CDI specification's own JSON schema (from Debian's package of
the CDI library), and given to a real container by podman, inside which
`tpuhal list` shows exactly the board it was given."""
import json
import os
import re
import shutil
import subprocess
import tarfile

import pytest

BIN = os.environ.get("TPUHAL_BIN_DIR", "")
TPUHAL = os.path.join(BIN, "tpuhal")
SIMD = os.path.join(BIN, "tpuhal-simd")
CDI_SCHEMA = "/usr/share/gocode/src/github.com/container-orchestrated-devices/container-device-interface/schema"

# The CDI library's rules for names (pkg/cdi/qualified-device.go).
VENDOR = re.compile(r"^[A-Za-z](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$")
CLASS = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


def plain_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """A daemon sharing two tiny boards."""
    d = tmp_path_factory.mktemp("cdi")
    sock = str(d / "simd.sock")
    p = subprocess.Popen([SIMD, "--socket", sock, "--board", "tiny", "--board", "tiny", "--vfs", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if "serving" not in line:
        p.kill()
        pytest.fail(f"tpuhal-simd did not start: {line!r} {p.stderr.read()!r}")
    yield {"dir": d, "socket": sock}
    p.terminate()
    p.wait(10)
    p.stdout.close()
    p.stderr.close()


def generate(daemon, *args, kind="tpuhal.dev/board"):
    out = daemon["dir"] / "spec.json"
    r = subprocess.run([TPUHAL, "cdi", "generate", "--output", str(out), "--kind", kind, *args],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, TPUHAL_SIMD=daemon["socket"]))
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text()), r.stderr


def test_the_spec_follows_the_cdi_schema_and_names(daemon):
    spec, notes = generate(daemon)
    jsonschema = pytest.importorskip("jsonschema", reason="python3-jsonschema (scripts/setup.sh installs it)")
    if not os.path.exists(f"{CDI_SCHEMA}/schema.json"):
        pytest.fail(f"the CDI schema is missing at {CDI_SCHEMA} (Debian: golang-github-container-orchestrated-"
                    "devices-container-device-interface-dev; scripts/setup.sh installs it)")
    schema = json.load(open(f"{CDI_SCHEMA}/schema.json"))
    defs = json.load(open(f"{CDI_SCHEMA}/defs.json"))
    resolver = jsonschema.RefResolver(f"file://{CDI_SCHEMA}/schema.json", schema, store={"defs.json": defs})
    jsonschema.Draft7Validator(schema, resolver=resolver).validate(spec)
    # And a spec the schema must refuse is refused (the check has teeth).
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema, resolver=resolver).validate({"cdiVersion": "0.5.0", "kind": "a/b",
                                                                        "devices": [{"name": "0"}]})
    vendor, cls = spec["kind"].split("/")
    assert VENDOR.match(vendor) and CLASS.match(cls)
    names = [d["name"] for d in spec["devices"]]
    assert names == ["0", "1", "all"]
    assert all(NAME.match(n) for n in names)
    # The in-process simulated board cannot go into a container: left out, saying why.
    assert "left out sim:0" in notes


def test_each_device_mounts_the_socket_and_names_its_board(daemon):
    spec, _ = generate(daemon)
    sock = daemon["socket"]
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    for i in (0, 1):
        edits = by_name[str(i)]
        assert edits["mounts"] == [{"hostPath": sock, "containerPath": sock, "options": ["bind"]}]
        assert edits["env"] == [f"TPUHAL_VISIBLE_DEVICE_{i}=simd:{sock}#{i}"]
        assert "deviceNodes" not in edits
    assert sorted(by_name["all"]["env"]) == [f"TPUHAL_VISIBLE_DEVICE_{i}=simd:{sock}#{i}" for i in (0, 1)]
    assert len(by_name["all"]["mounts"]) == 1
    # --device picks boards; a bad kind or action is refused.
    spec, _ = generate(daemon, "--device", f"simd:{sock}#1")
    assert [d["name"] for d in spec["devices"]] == ["0", "all"]
    r = subprocess.run([TPUHAL, "cdi", "generate", "--kind", "no-slash"], capture_output=True, text=True)
    assert r.returncode == 2 and "VENDOR/CLASS" in r.stderr
    r = subprocess.run([TPUHAL, "cdi", "make"], capture_output=True, text=True)
    assert r.returncode == 2 and "'generate'" in r.stderr


def test_a_link_planted_at_the_output_or_its_old_tmp_name_is_replaced_not_followed(daemon, tmp_path):
    """In a directory others may write to (fs.protected_symlinks=0), links
    at --output and at the name the spec used to be staged under point at a
    victim's file, and one at a file that does not exist yet: the spec
    replaces the links and neither victim is written or made."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "tpuhal.json"
    out.symlink_to(victim)
    (tmp_path / "tpuhal.json.tmp").symlink_to(victim)
    (tmp_path / "new.json").symlink_to(tmp_path / "made-by-the-spec")
    env = dict(os.environ, TPUHAL_SIMD=daemon["socket"])
    for target in (out, tmp_path / "new.json"):
        r = subprocess.run([TPUHAL, "cdi", "generate", "--output", str(target)], capture_output=True, text=True,
                           timeout=60, env=env)
        assert r.returncode == 0, r.stderr
        assert not target.is_symlink() and target.is_file()
        assert [d["name"] for d in json.loads(target.read_text())["devices"]] == ["0", "1", "all"]
    assert victim.read_text() == "precious"
    assert sorted(os.listdir(tmp_path)) == ["new.json", "tpuhal.json", "tpuhal.json.tmp", "victim"]
    # A directory that cannot take the file: refused by name, nothing left.
    r = subprocess.run([TPUHAL, "cdi", "generate", "--output", str(tmp_path / "nowhere" / "x.json")],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1 and f"cannot create {tmp_path / 'nowhere' / 'x.json'}" in r.stderr


def list_with(env_extra):
    """`tpuhal list --json` with exactly these variables added (no TPUHAL_SIMD)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPUHAL_SIMD", "TPUHAL_VISIBLE"))}
    env.update(env_extra)
    r = subprocess.run([TPUHAL, "list", "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return [d["uri"] for d in json.loads(r.stdout)]


def test_a_device_s_environment_lists_exactly_its_board(daemon):
    spec, _ = generate(daemon)
    one = dict(e.split("=", 1) for e in spec["devices"][1]["containerEdits"]["env"])
    assert list_with(one) == [f"simd:{daemon['socket']}#1"]
    every = dict(e.split("=", 1) for e in spec["devices"][2]["containerEdits"]["env"])
    assert list_with(every) == [f"simd:{daemon['socket']}#{i}" for i in (0, 1)]
    # TPUHAL_VISIBLE_DEVICES, the comma-separated form, restricts the same way.
    assert list_with({"TPUHAL_VISIBLE_DEVICES": "sim:0"}) == ["sim:0"]


def podman_run(image, *args, extra=()):
    cmd = ["podman", "--runtime", "runc", "run", "--rm", "--network=none",
           # Limits this host already grants: a container may not raise them.
           "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000", *extra, image, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=plain_env())


@pytest.fixture
def podman_image(tmp_path):
    """An image with nothing but busybox (no registry is reachable), and a
    spec of a kind of this test's own in /var/run/cdi."""
    if os.geteuid() != 0:
        pytest.skip("podman reads CDI specs from /etc/cdi and /var/run/cdi, which only root may write")
    if not shutil.which("podman") or not shutil.which("runc") or not os.path.exists("/bin/busybox"):
        pytest.fail("podman, runc and busybox-static are needed (scripts/setup.sh installs them)")
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", root / "bin" / "busybox")
    for link, target in (("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")):
        os.symlink(target, root / link)
    with tarfile.open(tmp_path / "rootfs.tar", "w") as t:
        t.add(root, arcname=".")
    image = f"localhost/tpuhal-cdi-test-{os.getpid()}"
    r = subprocess.run(["podman", "import", str(tmp_path / "rootfs.tar"), image], capture_output=True, text=True,
                       timeout=300, env=plain_env())
    assert r.returncode == 0, r.stderr
    kind = f"test{os.getpid()}.tpuhal.dev/board"
    spec_path = f"/var/run/cdi/tpuhal-test-{os.getpid()}.json"
    yield image, kind, spec_path
    if os.path.exists(spec_path):
        os.remove(spec_path)
    subprocess.run(["podman", "rmi", "-f", image], capture_output=True, env=plain_env())


def install_spec(daemon, kind, spec_path):
    spec, _ = generate(daemon, kind=kind)
    os.makedirs("/var/run/cdi", exist_ok=True)
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    return spec


def test_podman_writes_exactly_the_board_s_edits_into_the_container_s_config(daemon, podman_image):
    """podman create --device KIND=1, then init: the OCI configuration it
    writes carries board 1's mount and variable and nothing of board 0's
    (init may fail to start the runtime where it cannot set limits; the
    configuration is written before that)."""
    image, kind, spec_path = podman_image
    install_spec(daemon, kind, spec_path)
    name = f"tpuhal-cdi-{os.getpid()}"
    r = subprocess.run(["podman", "create", "--name", name, "--network=none", "--device", f"{kind}=1", image,
                        "/bin/busybox", "true"], capture_output=True, text=True, timeout=300, env=plain_env())
    assert r.returncode == 0, r.stderr
    try:
        subprocess.run(["podman", "init", name], capture_output=True, text=True, timeout=300, env=plain_env())
        static = subprocess.run(["podman", "inspect", name, "--format", "{{.StaticDir}}"], capture_output=True,
                                text=True, timeout=60, env=plain_env()).stdout.strip()
        config = json.load(open(os.path.join(static, "config.json")))
        sock = daemon["socket"]
        env = [e for e in config["process"]["env"] if e.startswith("TPUHAL")]
        assert env == [f"TPUHAL_VISIBLE_DEVICE_1=simd:{sock}#1"]
        mounts = [m for m in config["mounts"] if m["destination"] == sock]
        assert len(mounts) == 1 and mounts[0]["source"] == sock and "bind" in mounts[0]["options"]
        # A process started with that environment lists exactly board 1.
        assert list_with(dict(e.split("=", 1) for e in env)) == [f"simd:{sock}#1"]
    finally:
        subprocess.run(["podman", "rm", "-f", name], capture_output=True, env=plain_env())
    # A device the spec does not have is refused when the container is set up.
    subprocess.run(["podman", "create", "--name", name, "--device", f"{kind}=9", image, "/bin/busybox", "true"],
                   capture_output=True, text=True, timeout=300, env=plain_env(), check=True)
    try:
        r = subprocess.run(["podman", "init", name], capture_output=True, text=True, timeout=300, env=plain_env())
        assert r.returncode != 0 and f"unresolvable CDI devices {kind}=9" in r.stderr, r.stderr
    finally:
        subprocess.run(["podman", "rm", "-f", name], capture_output=True, env=plain_env())


def test_podman_gives_a_container_exactly_the_board_it_asked_for(daemon, podman_image):
    """Where this machine can run containers: `tpuhal list` and `tpuhal demo`
    inside one, the host's /usr and the build tree mounted read-only."""
    image, kind, spec_path = podman_image
    probe = podman_run(image, "/bin/busybox", "true")
    if probe.returncode != 0:
        pytest.skip(f"this machine cannot run containers (podman run of a busybox image: {probe.stderr.strip()})")
    install_spec(daemon, kind, spec_path)
    build = os.path.dirname(os.path.abspath(BIN))
    mounts = ["-v", "/usr:/usr:ro", "-v", f"{build}:{build}:ro"]
    r = podman_run(image, TPUHAL, "list", "--json", extra=[*mounts, "--device", f"{kind}=1"])
    assert r.returncode == 0, r.stderr
    assert [d["uri"] for d in json.loads(r.stdout)] == [f"simd:{daemon['socket']}#1"]
    # The board works from inside: the demo moves data through it and checks it.
    r = podman_run(image, TPUHAL, "demo", "--size", "4MiB", "--device", f"simd:{daemon['socket']}#1",
                   extra=[*mounts, "--device", f"{kind}=1"])
    assert r.returncode == 0, r.stdout + r.stderr
    r = podman_run(image, TPUHAL, "list", "--json", extra=[*mounts, "--device", f"{kind}=all"])
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)) == 2
    # Without the device: no socket, no board.
    r = podman_run(image, "/bin/busybox", "ls", daemon["socket"], extra=mounts)
    assert r.returncode != 0
