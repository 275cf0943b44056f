"""A schema registry for the local stack: Apicurio Registry's app from Maven Central, serving
the Confluent-compatible REST API (``/apis/ccompat/v7``) with in-memory storage on loopback.

Rules:
- The app is ``io.apicurio:apicurio-registry-app:<version>:tar.gz:all`` (a Quarkus
  application, ~160 MB), fetched once per machine with ``mvn dependency:copy`` (local repo
  ``<cache>/m2``, as Kafka's jars) and unpacked into ``<cache>/apicurio-registry-<version>``
  under a file lock; a half-unpacked directory is never used (it is renamed into place).
- It needs Java 21 or newer (its classes are version 65): ``java_binary`` takes
  ``$JAVA_HOME/bin/java``, then ``java`` on PATH, then the newest JDK under
  ``/usr/lib/jvm``, the first whose major version is >= 21; with none it says how to get one.
- Both of its listeners bind 127.0.0.1: the API on ``FENCE_SCHEMA_REGISTRY_PORT``, Quarkus'
  management interface (which the app builds in and would bind to 0.0.0.0:9000) on
  ``FENCE_SCHEMA_REGISTRY_MANAGEMENT_PORT``. Its command line carries the service
  directory (``-Dfenceworker.stack=...``) as the pid marker.
- Healthy means ``GET /apis/ccompat/v7/subjects`` answers a JSON list.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

from ops.stack.config import HOST, REGISTRY_VERSION, Service, StackError, StackSettings
from ops.stack.procs import file_lock, spawn

__all__ = ["ARTIFACT", "CCOMPAT", "STOP_SIGNAL", "app_dir", "check", "java_binary",
           "java_major", "marker", "start", "url"]

STOP_SIGNAL = signal.SIGTERM
ARTIFACT = f"io.apicurio:apicurio-registry-app:{REGISTRY_VERSION}:tar.gz:all"
CCOMPAT = "/apis/ccompat/v7"  # the Confluent Schema Registry API, version 7
JAVA_MIN = 21
HEAP = "256m"
_JVM_DIR = Path("/usr/lib/jvm")


def url(settings: StackSettings) -> str:
    """The registry's Confluent-compatible base URL (``SCHEMA_REGISTRY_URL``)."""
    return f"http://{HOST}:{settings.ports.schema_registry}{CCOMPAT}"


def _svc(settings: StackSettings) -> Path:
    return settings.paths.service_dir(Service.REGISTRY)


def marker(settings: StackSettings) -> str:
    """A string the registry's command line contains (its service directory)."""
    return f"-Dfenceworker.stack={_svc(settings)}"


def app_dir(settings: StackSettings) -> Path:
    """The unpacked app, fetched from Maven Central when missing; raises StackError."""
    target = settings.paths.registry_app
    if (target / "quarkus-run.jar").exists():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError("mvn (Apache Maven) is not on PATH; it fetches Apicurio Registry "
                         "from Maven Central. Install it: sudo apt-get install -y maven")
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f"{target.name}.lock"):
        if (target / "quarkus-run.jar").exists():  # another process fetched it meanwhile
            return target
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        log = target.parent / f"{target.name}.mvn.log"
        argv = [mvn, "-q", "-B", f"-Dmaven.repo.local={settings.paths.cache / 'm2'}",
                "dependency:copy", f"-Dartifact={ARTIFACT}", f"-DoutputDirectory={tmp}"]
        with open(log, "w") as fh:
            done = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, check=False)
        archives = sorted(tmp.glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            shutil.rmtree(tmp, ignore_errors=True)
            raise StackError(
                f"Maven could not fetch {ARTIFACT} (exit {done.returncode}); check access to "
                f"Maven Central (proxy settings in ~/.m2/settings.xml). Log {log}:\n{tail}")
        with tarfile.open(archives[0]) as archive:
            archive.extractall(tmp / "app", filter="data")
        archives[0].unlink()
        root = next((p.parent for p in (tmp / "app").rglob("quarkus-run.jar")), None)
        if root is None:
            shutil.rmtree(tmp, ignore_errors=True)
            raise StackError(f"{ARTIFACT} holds no quarkus-run.jar; is the version right?")
        shutil.rmtree(target, ignore_errors=True)
        root.rename(target)
        shutil.rmtree(tmp, ignore_errors=True)
    return target


_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_major(java: str) -> int | None:
    """The major version ``java -version`` reports (1.8 -> 8), None when it does not run."""
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    m = _VERSION.search(done.stderr + done.stdout)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def java_binary(env: dict[str, str] | None = None) -> str:
    """A Java >= 21 (see the module Rules); raises StackError saying how to get one."""
    env = dict(os.environ) if env is None else env
    chosen = []  # the user's: JAVA_HOME, then PATH
    home = env.get("JAVA_HOME", "").strip()
    if home:
        chosen.append(str(Path(home) / "bin" / "java"))
    on_path = shutil.which("java", path=env.get("PATH"))
    if on_path:
        chosen.append(on_path)
    installed = sorted(str(p / "bin" / "java") for p in _JVM_DIR.glob("*")
                       if (p / "bin" / "java").exists()) if _JVM_DIR.is_dir() else []
    seen: list[str] = []
    best: tuple[int, str] | None = None
    for java in dict.fromkeys(chosen + installed):
        major = java_major(java)
        seen.append(f"{java} ({'does not run' if major is None else f'Java {major}'})")
        if major is None or major < JAVA_MIN:
            continue
        if java in chosen:
            return java
        if best is None or major > best[0]:
            best = (major, java)
    if best is not None:
        return best[1]
    raise StackError(
        f"the schema registry (Apicurio Registry {REGISTRY_VERSION}) needs Java {JAVA_MIN} or "
        f"newer; found {', '.join(seen) or 'no java at all'}. Install one, e.g. "
        "`sudo apt-get install -y openjdk-21-jre-headless` (Debian 13, Ubuntu 24.04) or a "
        "Temurin 21 JDK (https://adoptium.net), then set JAVA_HOME to it or put its bin/ "
        "on PATH")


def start(settings: StackSettings) -> int:
    """Fetch the app if needed and start it detached (in-memory storage); return the pid."""
    java = java_binary()
    app = app_dir(settings)
    svc = _svc(settings)
    svc.mkdir(parents=True, exist_ok=True)
    env = {**os.environ,
           "QUARKUS_HTTP_HOST": HOST, "QUARKUS_HTTP_PORT": str(settings.ports.schema_registry),
           "QUARKUS_MANAGEMENT_HOST": HOST,
           "QUARKUS_MANAGEMENT_PORT": str(settings.ports.schema_registry_management)}
    argv = [java, "-Xms64m", f"-Xmx{HEAP}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true", marker(settings), "-jar", str(app / "quarkus-run.jar")]
    return spawn(argv, log_path=settings.paths.log_file(Service.REGISTRY),
                 pid_path=settings.paths.pid_file(Service.REGISTRY), env=env, cwd=svc)


def check(settings: StackSettings, *, timeout_s: float = 5.0) -> str | None:
    """List the registry's subjects; None when healthy, else the reason."""
    where = f"{url(settings)}/subjects"
    try:
        with urllib.request.urlopen(where, timeout=timeout_s) as resp:
            body = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"GET {where} failed: {exc}"
    if not isinstance(body, list):
        return f"GET {where} answered {body!r:.200}, not a list of subjects"
    return None
