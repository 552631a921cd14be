"""The sandbox tested like a sandbox: each escape or abuse an agent could try (writes outside the workdir, host secrets,
the parent's environment, the host's loopback, a fork bomb, an endless loop, a flood of output, a 4 GB allocation, a
background process that outlives its command, the host's Python, killing the parent) is tried for real and shown
contained, with the host checked unchanged after. The Modal backend is checked against a local stand-in whose calls
are bound to the installed `modal`'s real signatures (no Modal service is reachable here)."""
import inspect, os, signal, socket, subprocess, sys, sysconfig, threading, time
from pathlib import Path

import pytest

from composer_replication import sandbox_local as L
from composer_replication.sandbox import Sandbox, SandboxError, SandboxResult

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(L.local_sandbox_unavailable() is not None, reason=f"{L.local_sandbox_unavailable()}")


def _host_pids_running(marker: str) -> list[int]:
    "Host pids whose command line contains `marker`."
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit(): continue
        try: cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError: continue
        if marker in cmd and "pytest" not in cmd: out.append(int(p))
    return out


@pytest.fixture
def repo(tmp_path):
    "A small repository with a failing test, the workdir of most tests; a sibling folder stands for the rest of the host."
    w = tmp_path / "repo"
    (w / "pkg").mkdir(parents=True)
    (w / "pkg/__init__.py").write_text("")
    (w / "pkg/mod.py").write_text("def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n")
    (w / "test_mod.py").write_text("from pkg.mod import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    (tmp_path / "host").mkdir()
    (tmp_path / "host/keep.txt").write_text("host file\n")
    return w


@pytest.fixture
def sb(repo):
    with Sandbox(repo, timeout_s=20) as s: yield s


def _snapshot(d: Path) -> dict:
    return {p.relative_to(d).as_posix(): (p.read_bytes() if p.is_file() else None) for p in sorted(d.rglob("*"))}


# --- the API ---

def test_api(sb, repo):
    assert issubclass(SandboxError, ValueError)
    r = sb.run("pwd; echo err >&2; exit 3")
    assert r == SandboxResult(3, f"{repo.resolve()}\n", "err\n", False, False)
    assert sb.run("python -m pytest -q -p no:cacheprovider").returncode == 1
    assert sb.edit("pkg/mod.py", "def add(a, b):\n    return a - b", "def add(a, b):\n    return a + b") == 1
    r = sb.run("python -m pytest -q -p no:cacheprovider")
    assert r.returncode == 0 and "1 passed" in r.stdout
    assert sb.write("pkg/new.py", "X = 1\n") == 6 and (repo / "pkg/new.py").read_text() == "X = 1\n"
    assert sb.read("pkg/new.py") == "X = 1\n"
    assert sb.glob("**/*.py") == ["pkg/__init__.py", "pkg/mod.py", "pkg/new.py", "test_mod.py"]
    assert sb.glob("pkg/*.py")[0] == "pkg/__init__.py"
    assert sb.grep(r"def add") == ["pkg/mod.py:1:def add(a, b):"]
    assert sb.grep(r"^def \w+", path="pkg") == ["pkg/mod.py:1:def add(a, b):", "pkg/mod.py:5:def sub(a, b):"]
    assert sb.grep("add", glob="test_*.py") == ["test_mod.py:1:from pkg.mod import add", "test_mod.py:4:def test_add():",
                                                "test_mod.py:5:    assert add(2, 3) == 5"]


@pytest.mark.parametrize("old,new,replace_all,expect", [
    ("a - b", "a + b", False, "occurs 2 times in pkg/mod.py: give more context"),
    ("a - b", "a + b", True, 2),
    ("nowhere", "x", False, "old_string not found in pkg/mod.py"),
    ("a - b", "a - b", False, "nothing to change"),
    ("", "x", False, "must not be empty"),
])
def test_edit_semantics(sb, repo, old, new, replace_all, expect):
    before = (repo / "pkg/mod.py").read_text()
    if isinstance(expect, int):
        assert sb.edit("pkg/mod.py", old, new, replace_all=replace_all) == expect
        assert (repo / "pkg/mod.py").read_text() == before.replace(old, new)
    else:
        with pytest.raises(SandboxError, match=expect): sb.edit("pkg/mod.py", old, new, replace_all=replace_all)
        assert (repo / "pkg/mod.py").read_text() == before


def test_settings_checked(repo):
    for kw, msg in [({"timeout_s": 0}, "timeout_s must be a number > 0"), ({"memory_mb": 1}, "memory_mb must be"),
                    ({"max_output_bytes": True}, "max_output_bytes must be"), ({"env": {"A B": "x"}}, "env must map names")]:
        with pytest.raises(SandboxError, match=msg): Sandbox(repo, **kw)
    with pytest.raises(SandboxError, match="workdir must be an existing folder"): Sandbox(repo / "nope")


# --- writes outside the workdir ---

@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink_dir", "symlink_file"])
def test_file_methods_refuse_paths_outside(sb, repo, how):
    host = repo.parent / "host"
    os.symlink(host, repo / "hostlink")
    os.symlink(host / "keep.txt", repo / "keeplink")
    path = {"absolute": str(host / "keep.txt"), "dotdot": "../host/keep.txt", "symlink_dir": "hostlink/keep.txt",
            "symlink_file": "keeplink"}[how]
    before = _snapshot(host)
    for call in (lambda: sb.write(path, "pwned"), lambda: sb.edit(path, "host", "pwned"), lambda: sb.read(path),
                 lambda: sb.write(path.replace("keep.txt", "new.txt"), "pwned"), lambda: sb.grep("host", path=path)):
        with pytest.raises(SandboxError, match="outside the sandbox's workdir"): call()
    with pytest.raises(SandboxError, match="must stay inside"): sb.glob("../host/*")
    assert _snapshot(host) == before


def test_commands_cannot_write_outside(sb, repo):
    host = repo.parent / "host"
    os.symlink(host, repo / "hostlink")
    before, venv_before = _snapshot(host), sorted(os.listdir(sys.prefix))
    r = sb.run(f"echo pwned > {host}/keep.txt; echo pwned > ../host/new.txt; echo pwned > hostlink/keep.txt; "
               f"mkdir -p {REPO}/pwned; touch /usr/pwned /etc/pwned {sys.prefix}/pwned; echo done")
    assert r.stdout == "done\n"
    assert "Read-only file system" in r.stderr
    assert _snapshot(host) == before and not (REPO / "pwned").exists() and not Path("/usr/pwned").exists()
    assert not Path("/etc/pwned").exists() and sorted(os.listdir(sys.prefix)) == venv_before


# --- privileges: none inside, even when the host runs as root ---

@pytest.mark.parametrize("cmd,says", [
    ("mount -t tmpfs none /usr", "permission denied"),
    ("mount --bind / /tmp", "permission denied"),
    ("mknod /tmp/null2 c 1 3", "Operation not permitted"),
    ("echo 1 > /proc/sys/vm/drop_caches", "Read-only file system"),          # sysctls check the uid, not a capability
    ("echo '|/tmp/x' > /proc/sys/kernel/core_pattern", "Read-only file system"),
    ("hostname evil", "must be root"),
    ("ip link set lo down", "Operation not permitted"),
    ("nsenter -t 1 -m true", "Operation not permitted"),
    ("ulimit -Hu unlimited", "cannot modify limit"),
    ("ls /sys/fs/cgroup", "No such file or directory"),
    ("grep -E '^Cap(Prm|Eff|Bnd|Amb):' /proc/self/status | grep -v 0000000000000000", ""),
    ("unshare -U -r true", "unshare failed"),                                  # no user namespace to regain capabilities in
])
def test_no_privileges(sb, cmd, says):
    r = sb.run(cmd)
    assert r.returncode != 0 and says in r.stderr, r


def test_no_new_privileges(sb):
    assert "NoNewPrivs:\t1" in sb.run("cat /proc/self/status").stdout


# --- secrets: files and the parent's environment ---

def test_host_secret_file_not_readable(sb, repo, tmp_path):
    secret = REPO / "tests" / f".secret-{os.getpid()}.txt"  # outside /tmp too (the sandbox's /tmp is its own)
    secret.write_text("sk-host-secret-123\n")
    try:
        r = sb.run(f"cat {secret} {tmp_path}/host/keep.txt /root/.bash_history /etc/shadow; ls {REPO}; ls -A /root")
        assert "sk-host-secret" not in r.stdout and "host file" not in r.stdout, r.stdout
        assert r.stdout.strip() in ("", ".pyenv") and r.stderr.count("No such file or directory") >= 4, r
        with pytest.raises(SandboxError): sb.read(str(secret))
    finally: secret.unlink()


def test_parent_environment_not_visible(repo, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-parent-secret")
    with Sandbox(repo, env={"GIVEN": "yes"}) as sb:
        assert Path(f"/proc/{sb.backend.proc.pid}/environ").read_bytes() == b""  # bubblewrap itself started with nothing
        r = sb.run("env; cat /proc/1/environ /proc/*/environ /proc/self/environ | tr '\\0' '\\n'; "
                   "grep -r sk-ant /proc/*/environ /proc/*/cmdline 2>/dev/null; echo end")
    assert "sk-ant-parent-secret" not in r.stdout + r.stderr and "ANTHROPIC" not in r.stdout
    names = {l.split("=", 1)[0] for l in r.stdout.splitlines() if "=" in l}
    assert names <= {"PATH", "HOME", "LANG", "GIVEN", "PWD", "SHLVL", "_", "OLDPWD"}, names
    assert f"HOME={repo.resolve()}" in r.stdout and "GIVEN=yes" in r.stdout


# --- the network ---

@pytest.fixture
def loopback_server():
    "A TCP server on the host's 127.0.0.1 that greets every connection; stopped after the test."
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(8); srv.settimeout(0.2)
    stop = threading.Event()
    def serve():
        while not stop.is_set():
            try: c, _ = srv.accept()
            except OSError: continue
            with c: c.sendall(b"hello from the host\n")
    t = threading.Thread(target=serve, daemon=True); t.start()
    yield srv.getsockname()[1]
    stop.set(); t.join(5); srv.close()


@pytest.mark.parametrize("network", [False, True])
def test_loopback_tcp(repo, loopback_server, network):
    code = f"import socket; s = socket.create_connection(('127.0.0.1', {loopback_server}), timeout=5); print(s.recv(100).decode())"
    with Sandbox(repo, network=network) as sb: r = sb.run(f'python -c "{code}"')
    if network: assert r.returncode == 0 and r.stdout == "hello from the host\n\n", r
    else: assert r.returncode != 0 and "ConnectionRefusedError" in r.stderr and "hello" not in r.stdout, r


# --- limits: processes, time, output, memory ---

def test_fork_bomb_bounded(repo):
    with Sandbox(repo, max_processes=64) as sb:
        t = time.monotonic()
        r = sb.run("f() { f | f & }; f; sleep 2; echo survived", timeout_s=4)
        took = time.monotonic() - t
        peak = [d for d in sb.backend.cgroups if Path(d, "pids.peak").exists()]
        if peak: assert int(Path(peak[0], "pids.peak").read_text()) <= 64
        assert sb.run("echo alive").stdout == "alive\n"
    assert took < 10, took
    assert subprocess.run(["true"]).returncode == 0  # the host still forks


def test_endless_loop_times_out(sb):
    t = time.monotonic()
    r = sb.run("while true; do :; done", timeout_s=1)
    assert r.timed_out and r.returncode == -9 and time.monotonic() - t < 5
    r = sb.run("sleep 30 & sleep 30 & wait", timeout_s=1)
    assert r.timed_out and sb.run("ps -e -o comm=").stdout.split().count("sleep") == 0


def test_200mb_of_output_truncated(sb):
    t = time.monotonic()
    r = sb.run("python -c \"import sys; [sys.stdout.write('x' * 1_000_000) for _ in range(200)]\"")
    assert r.truncated and len(r.stdout) + len(r.stderr) == 1_000_000 and r.returncode == -9 and time.monotonic() - t < 20
    assert sb.run("yes | head -c 200000000 >/dev/null; echo fine").stdout == "fine\n"  # output that does not reach us is fine


def test_4gb_allocation_bounded(repo):
    with Sandbox(repo, memory_mb=512) as sb:
        r = sb.run("python -c \"b = bytearray(4 << 30); print(len(b))\"")
        assert r.returncode != 0 and r.stdout == "", r
        r = sb.run("python -c \"b = [bytearray(1 << 20) for _ in range(4096)]; print(len(b))\"")  # touched, page by page
        assert r.returncode != 0 and r.stdout == "", r
        assert sb.run("echo alive").stdout == "alive\n"


def test_background_processes_gone(repo):
    marker = f"{os.getpid() % 1000 + 9000}.{int(time.time()) % 1000}"
    with Sandbox(repo) as sb:
        t = time.monotonic()
        r = sb.run(f"sleep {marker} & echo started")
        assert r.stdout == "started\n" and time.monotonic() - t < 5  # the call returns: the background is not waited for
        assert _host_pids_running(f"sleep {marker}") == []  # killed with its command
        sb.run(f"setsid sleep {marker} >/dev/null 2>&1 < /dev/null & nohup sleep {marker} >/dev/null 2>&1 & sleep 0.5")
        assert len(_host_pids_running(f"sleep {marker}")) == 1  # the one that left the session outlives its command
        cgroups = list(sb.backend.cgroups)
    assert _host_pids_running(f"sleep {marker}") == [] and not any(map(os.path.exists, cgroups))  # ... not the sandbox


# --- the host's Python and the parent ---

def test_host_python_unmodified(sb):
    purelib = Path(sysconfig.get_paths()["purelib"])
    before = sorted(os.listdir(purelib))
    r = sb.run(f"python -c \"import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'evil.pth').write_text('import os')\"; "
               f"python -m pip install --no-index --no-deps nothing-here 2>&1 | tail -1; echo x >> {sys.executable}; "
               f"rm -rf {purelib}/pytest; echo end")
    assert "Read-only file system" in r.stderr and r.stdout.endswith("end\n")
    assert sorted(os.listdir(purelib)) == before and (purelib / "pytest").is_dir()
    assert subprocess.run([sys.executable, "-c", "import pytest"]).returncode == 0


def test_cannot_kill_the_parent(repo):
    sentinel = subprocess.Popen(["sleep", "300"])
    try:
        with Sandbox(repo) as sb:
            r = sb.run(f"kill -9 {os.getpid()} {sentinel.pid} {os.getppid()}; kill -9 -1; pkill -9 -f pytest; echo tried")
            assert "No such process" in r.stderr or r.returncode != 0
            assert sb.run("echo the server survives kill -9 -1").returncode == 0  # it is pid 1 of the sandbox
        assert sentinel.poll() is None
    finally: sentinel.kill(); sentinel.wait()


def test_sandboxes_isolated_from_each_other(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"; a.mkdir(); b.mkdir()
    with Sandbox(a) as sa, Sandbox(b) as sb_:
        sa.run("echo a > /tmp/shared; echo a > mine; sleep 100 & ")
        r = sb_.run(f"cat /tmp/shared; ls {a}; ps -e -o comm=")
        assert "a" not in r.stdout.split() and "sleep" not in r.stdout and "No such file" in r.stderr
        assert sa.run("cat /tmp/shared").stdout == "a\n"
    assert (a / "mine").exists() and not (b / "mine").exists()


# --- refusing where it cannot isolate ---

def test_refuses_without_bwrap(repo, monkeypatch):
    monkeypatch.setattr(L.shutil, "which", lambda name: None)
    with pytest.raises(SandboxError, match=r"^bubblewrap is not installed .*refusing to run commands unsandboxed$"): Sandbox(repo)


def test_root_refuses_without_cgroup(repo, monkeypatch):
    monkeypatch.setattr(L, "_make_cgroups", lambda *a: None)
    monkeypatch.setattr(L.os, "geteuid", lambda: 0)
    with pytest.raises(SandboxError, match="running as root and no cgroup is writable.*refusing to run unsandboxed"): Sandbox(repo)


# --- backends as plugins ---

def test_backends_are_plugins(repo):
    from composer_replication.plugins import PLUGIN_GROUPS, PluginError, entry_point_names
    assert PLUGIN_GROUPS["sandboxes"] == "composer_replication.sandboxes"
    assert {"local", "modal"} <= set(entry_point_names("sandboxes"))
    with pytest.raises(PluginError, match="backend must be \"local\""): Sandbox(repo, backend="lcoal")
    with Sandbox(repo, backend="composer_replication.sandbox_local:LocalSandbox") as sb: assert sb.run("true").returncode == 0


# --- the Modal backend, against a stand-in bound to modal's real signatures ---

class _FakeProcess:
    "Stands in for modal's ContainerProcess: the exec runs as a local process."
    def __init__(self, argv, cwd):
        self._p = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={})
        p = self._p
        self.stdin = type("W", (), {"write": lambda s, d: p.stdin.write(d), "write_eof": lambda s: p.stdin.close(), "drain": lambda s: None})()
        self.stdout = type("R", (), {"read": lambda s: p.stdout.read()})()
        self.stderr = type("R", (), {"read": lambda s: p.stderr.read()})()
    def wait(self): return self._p.wait()


class _FakeModalSandbox:
    "Stands in for modal.Sandbox: records every call (bound to the real signatures by the test) and runs execs locally."
    calls = []
    @classmethod
    def create(cls, *args, **kwargs):
        cls.calls.append(("create", args, kwargs)); return cls()
    def exec(self, *args, **kwargs):
        self.calls.append(("exec", args, kwargs))
        return _FakeProcess([sys.executable if args[0] == "python3" else args[0], *args[1:]], kwargs["workdir"])
    def terminate(self, **kwargs): self.calls.append(("terminate", (), kwargs))


def test_modal_backend_against_the_sdk(repo, tmp_path):
    modal = pytest.importorskip("modal", minversion="1.6")
    _FakeModalSandbox.calls = []
    remote = tmp_path / "remote"; remote.mkdir(); (remote / "f.py").write_text("x = 1\n")
    with Sandbox(repo, backend="modal", sandbox_cls=_FakeModalSandbox, image=modal.Image.debian_slim(), remote_workdir=str(remote),
                 memory_mb=1024, env={"A": "1"}) as sb:
        assert sb.run("pwd; echo out").stdout == f"{remote}\nout\n"
        assert sb.edit("f.py", "x = 1", "x = 2") == 1 and sb.read("f.py") == "x = 2\n" and sb.glob("*.py") == ["f.py"]
        with pytest.raises(SandboxError, match="outside the sandbox's workdir"): sb.write("../evil", "x")
        assert sb.run("sleep 10", timeout_s=1).timed_out
    kinds = [c[0] for c in _FakeModalSandbox.calls]
    assert kinds[0] == "create" and kinds[-1] == "terminate" and set(kinds[1:-1]) == {"exec"}
    real = {"create": modal.Sandbox.create, "exec": modal.Sandbox.exec, "terminate": modal.Sandbox.terminate}
    for kind, args, kwargs in _FakeModalSandbox.calls:
        bound = inspect.signature(real[kind]).bind(*(() if kind == "create" else (None,)), *args, **kwargs)  # TypeError on drift
        assert bound.arguments
    create = _FakeModalSandbox.calls[0][2]
    assert (create["memory"], create["block_network"], create["env"], create["workdir"]) == (1024, True, {"A": "1"}, str(remote))
    assert isinstance(create["image"], modal.Image)  # the workdir added with Image.add_local_dir(..., copy=True)
    from modal.io_streams import StreamReader, StreamWriter
    from modal.container_process import ContainerProcess
    for cls, names in ((StreamWriter, ("write", "write_eof", "drain")), (StreamReader, ("read",)), (ContainerProcess, ("wait", "stdin", "stdout", "stderr"))):
        for n in names: assert hasattr(cls, n), (cls, n)


def test_modal_backend_without_modal(repo):
    code = ("import sys; sys.modules['modal'] = None\nfrom composer_replication.sandbox import Sandbox, SandboxError\n"
            f"try: Sandbox({str(repo)!r}, backend='modal')\nexcept SandboxError as e: print(e)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert "pip install composer-replication[modal]" in r.stdout, r.stderr[-2000:]


# --- more of the boundary ---

def test_only_its_own_processes_visible(sb):
    n = int(sb.run("ls /proc | grep -E '^[0-9]+$' | wc -l").stdout)
    assert n <= 6, n  # the server, the shell, its pipeline
    assert sb.run("tr '\\0' '\\n' < /proc/1/cmdline | head -4").stdout.splitlines() == [sys.executable, "-I", "-S", "-c"]
    names = sb.run("tr '\\0' '\\n' < /proc/1/environ | cut -d= -f1").stdout.split()
    assert set(names) <= {"PATH", "HOME", "LANG", "PWD"}, names  # PWD: bubblewrap sets it to the workdir
    r = sb.run(f"ls /proc/{os.getpid()}/environ; kill -0 {os.getpid()}")
    assert r.returncode != 0


def test_command_symlinks_lead_nowhere(sb, repo):
    r = sb.run("ln -s / root_link; ln -s /etc/shadow shadow; cat root_link/etc/shadow shadow root_link/root/.bashrc; "
               f"ln {sys.executable} hard 2>&1; ls root_link/work")
    assert "Invalid cross-device link" in r.stdout and "No such file" in r.stderr and "root:" not in r.stdout, r
    assert not (repo / "hard").exists() or (repo / "hard").stat().st_nlink == 1
    with pytest.raises(SandboxError, match="outside"): sb.read("shadow")
    with pytest.raises(SandboxError, match="outside"): sb.write("root_link/tmp/x", "x")


def test_closed_sandbox_refuses(repo):
    sb = Sandbox(repo)
    cgroups = list(sb.backend.cgroups)
    sb.run("sleep 100 >/dev/null 2>&1 & setsid sleep 100 >/dev/null 2>&1 & sleep 0.2")
    sb.close(); sb.close()  # idempotent
    with pytest.raises(SandboxError, match="closed"): sb.run("true")
    assert not any(map(os.path.exists, cgroups))


def test_concurrent_sandboxes_from_threads(tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    def one(k):
        w = tmp_path / f"w{k}"; w.mkdir()
        with Sandbox(w) as sb:
            sb.write("id.txt", f"{k}\n"); sb.run(f"echo {k} > /tmp/id")
            time.sleep(0.3)
            return sb.run("cat /tmp/id id.txt; ls ..").stdout
    with ThreadPoolExecutor(4) as ex: outs = list(ex.map(one, range(4)))
    for k, out in enumerate(outs): assert out.splitlines()[:2] == [str(k), str(k)] and f"w{(k + 1) % 4}" not in out, out


def test_rlimit_fallback_without_cgroups(repo, monkeypatch):
    "A non-root host without a writable cgroup: the server sets RLIMIT_NPROC and RLIMIT_AS (as root here only AS binds)."
    monkeypatch.setattr(L, "_make_cgroups", lambda *a: None)
    monkeypatch.setattr(L.os, "geteuid", lambda: 1000)
    with Sandbox(repo, memory_mb=512) as sb:
        assert sb.backend.cgroups is None
        r = sb.run("python -c \"b = bytearray(1 << 30)\"")
        assert r.returncode == 1 and "MemoryError" in r.stderr, r
        assert sb.run("ulimit -v; ulimit -u").stdout.split() == [str(512 << 10), "256"]


def test_per_call_timeout_and_output_bytes(repo):
    with Sandbox(repo, timeout_s=5, max_output_bytes=100) as sb:
        r = sb.run("printf 'a%.0s' $(seq 1 80); printf 'b%.0s' $(seq 1 80) >&2")
        assert r.truncated and len(r.stdout) + len(r.stderr) == 100
        r = sb.run("printf 'é%.0s' $(seq 1 10)")  # 20 bytes of UTF-8
        assert r.stdout == "é" * 10 and not r.truncated
        assert sb.run("sleep 3", timeout_s=0.5).timed_out and not sb.run("sleep 0.1").timed_out


def test_venv_inside_the_workdir_stays_read_only():
    "With the repository itself as workdir, its .venv (the host's Python) is mounted read-only over the writable folder."
    if not Path(sys.prefix).resolve().is_relative_to(REPO): pytest.skip("the venv is not inside the repository")
    probe = Path(sys.prefix) / f"pwned-{os.getpid()}"
    try:
        with Sandbox(REPO) as sb:
            r = sb.run(f"touch {probe}; echo x >> {sys.prefix}/pyvenv.cfg")
        assert r.stderr.count("Read-only file system") == 2 and not probe.exists(), r
    finally: probe.unlink(missing_ok=True)


def test_failed_start_leaves_no_cgroup(repo, monkeypatch):
    made = []
    real = L._make_cgroups
    monkeypatch.setattr(L, "_make_cgroups", lambda *a: made.extend(real(*a)) or made)
    monkeypatch.setattr(L.subprocess, "Popen", lambda *a, **k: (_ for _ in ()).throw(OSError("no exec")))
    with pytest.raises(OSError, match="no exec"): Sandbox(repo)
    assert made and not any(map(os.path.exists, made))


NONROOT = '''import sys
sys.path.insert(0, sys.argv[2])
from composer_replication.sandbox import Sandbox
with Sandbox(sys.argv[1], memory_mb=256, max_processes=32) as sb:
    assert sb.backend.cgroups is None
    print(sb.run("id -u; ulimit -u; grep -E 'CapEff|CapBnd|NoNewPrivs' /proc/self/status").stdout, end="")
    print(sb.run("python3 -c 'b = bytearray(1 << 30)'").stderr.splitlines()[-1])
    r = sb.run("f() { f | f & }; f; sleep 1", timeout_s=3)
    print(sb.run("echo alive").stdout, end="")
'''


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists() or not Path("/usr/bin/setpriv").exists(),
                    reason="needs root (to become nobody), setpriv and a system Python")
def test_non_root_host_uses_rlimits(tmp_path):
    "A non-root host (nobody, the system Python: the module needs nothing beyond the standard library) has no cgroup to make: RLIMIT_NPROC/RLIMIT_AS inside bubblewrap's user namespace bound it."
    import shutil, tempfile
    w = Path(tempfile.mkdtemp(prefix="sandbox-nobody-")); os.chown(w, 65534, 65534)
    try:
        r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3", "-c", NONROOT,
                            str(w), str(REPO)], capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
        assert r.stdout.splitlines() == ["65534", "32", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1",
                                         "MemoryError", "alive"], (r.stdout, r.stderr[-2000:])
    finally: shutil.rmtree(w)


def test_read_bounded_by_max_output_bytes(repo):
    (repo / "big.txt").write_bytes(b"x" * 2_000_000 + b"y")
    with Sandbox(repo, max_output_bytes=1_000_000) as sb:
        with pytest.raises(SandboxError, match=r"big.txt is 2,000,001 bytes, over the limit of 1,000,000"): sb.read("big.txt")
        assert sb.run("head -c 10 big.txt").stdout == "x" * 10
        assert sb.edit("big.txt", "xy", "z") == 1  # an edit is bounded by the server's own limit (64 MiB), not the output's


def test_stale_cgroups_removed(repo):
    "A host killed with SIGKILL cannot remove its sandbox's cgroups; the next sandbox removes empty ones over a minute old."
    with Sandbox(repo) as sb: parents = [os.path.dirname(d) for d in sb.backend.cgroups]
    stale, fresh = [Path(p, "composer-sandbox-stale0test") for p in parents], [Path(p, "composer-sandbox-fresh0test") for p in parents]
    for d in stale + fresh: d.mkdir()
    try:
        for d in stale: os.utime(d, (time.time() - 3600, time.time() - 3600))
        with Sandbox(repo): pass
        assert not any(d.exists() for d in stale) and all(d.exists() for d in fresh)
    finally:
        for d in stale + fresh:
            if d.exists(): d.rmdir()


def test_host_python_named_through_a_hidden_folder(repo, tmp_path):
    """A host interpreter started by a relative path from a folder the sandbox does not show (`../.venv/bin/python` from a
    subfolder: Python keeps `<cwd>/../.venv/bin/python` as `sys.executable`) still starts the sandbox."""
    hidden = tmp_path / "elsewhere"; hidden.mkdir()
    code = ("import sys; from composer_replication.sandbox import Sandbox; "
            f"sb = Sandbox({str(repo)!r}); r = sb.run('python -c \"import sys; print(sys.prefix)\"'); sb.close(); "
            "print('..' in sys.executable, r.returncode, r.stdout.strip(), sep='|')")
    out = subprocess.run([os.path.relpath(sys.executable, hidden), "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=hidden, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    dotted, rc, prefix = out.stdout.strip().splitlines()[-1].split("|")
    assert dotted == "True" and rc == "0" and Path(prefix) == Path(sys.prefix), out.stdout
