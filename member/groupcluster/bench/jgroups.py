"""Build and start the JGroups peers: JGroups 5 from Maven Central, JGroups 2.12 from Debian's libjgroups-java.

The harness sources live in ``bench/peers/jgroups/`` of the repository (a Maven project for JGroups 5 and
second entry points, ``src-2.12/``, compiled with the same ``Core.java`` and ``LifecycleCore.java`` against the
2.12 jar). ``Harness``/``Harness212`` run the multicast workloads, ``Lifecycle``/``Lifecycle212`` the joins
and state transfers (:mod:`groupcluster.bench.lifecycle`). Builds go to
``~/.cache/groupcluster/bench`` (``$GROUPCLUSTER_BENCH_CACHE`` overrides it) in a folder named after a hash of
the sources, so an edit rebuilds and nothing lands in the work tree. Maven first runs offline (``-o``, from
the local repository filled by an earlier build) and goes to the registry only when that fails.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import GroupClusterError
from .fair import address_properties

JGROUPS_212_JARS = (Path("/usr/share/java/jgroups.jar"), Path("/usr/share/java/jgroups-2.12.2.Final.jar"))
JVM_OPTS = ("-Xms256m", "-Xmx512m", "-Djava.net.preferIPv4Stack=true")
# The files of bench/peers/jgroups/conf: JGroups 2.12 only. JGroups 5 runs the XML shipped in its jar
# (groupcluster.bench.fair.jgroups_config), written per run and passed as a path.
CONFIGS = {
    ("jgroups-2.12", "fifo"): "jgroups212-nakack2.xml",
    ("jgroups-2.12", "total-order"): "jgroups212-sequencer.xml",
    ("jgroups-2.12", "join-flush"): "jgroups212-flush.xml",
}


class BenchSetupError(GroupClusterError):
    """A peer cannot be built or found; the message says what to install."""


def harness_dir() -> Path:
    """bench/peers/jgroups of the repository this package runs from (an editable install)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "bench" / "peers" / "jgroups"
        if (candidate / "pom.xml").is_file():
            return candidate
    raise BenchSetupError(
        "bench/peers/jgroups not found: the JGroups peers need the groupcluster repository (editable install)"
    )


def cache_root() -> Path:
    return Path(os.environ.get("GROUPCLUSTER_BENCH_CACHE", Path.home() / ".cache" / "groupcluster" / "bench"))


def _digest(paths: list[Path], base: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p.relative_to(base)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def _sources(root: Path, *subdirs: str) -> list[Path]:
    return [p for d in subdirs for p in (root / d).rglob("*.java")]


def _run(cmd: list[str], cwd: Path, log: Path) -> bool:
    with open(log, "ab") as fh:
        fh.write(("$ " + " ".join(cmd) + "\n").encode())
        fh.flush()
        return subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode == 0


@dataclass(frozen=True)
class JavaPeer:
    """How to start one member JVM of a JGroups version."""

    system: str
    classpath: str
    main_class: str
    conf_dir: Path
    lifecycle_class: str = ""

    def _java(
        self, config: str | Path, ports: list[int], rank: int, discover: int, main: str, extra: Sequence[str] = ()
    ) -> list[str]:
        """``config`` names a file of ``conf_dir`` (CONFIGS) or is the path of a file written from the jar's."""
        if isinstance(config, Path):
            conf = config
            props = [f"-D{k}={v}" for k, v in address_properties(ports, rank).items()]
        else:
            conf = self.conf_dir / CONFIGS[(self.system, config)]
            hosts = ",".join(f"127.0.0.1[{p}]" for p in ports)
            props = [f"-Djgroups.bind_port={ports[rank]}", f"-Djgroups.initial_hosts={hosts}"]
        return [
            "java",
            *JVM_OPTS,
            *extra,  # after JVM_OPTS: a later -Xmx wins
            *props,
            f"-Djgroups.members={discover}",
            "-cp",
            self.classpath,
            main,
            str(conf),
        ]

    def command(self, order: str, cluster: str, ports: list[int], rank: int, options: list[str]) -> list[str]:
        main = self._java(order, ports, rank, len(ports), self.main_class)
        return [*main, cluster, "--rank", str(rank), *options]

    def lifecycle_command(
        self,
        config: str | Path,
        cluster: str,
        ports: list[int],
        rank: int,
        mode: str,
        options: list[str],
        discover: int,
        jvm_extra: Sequence[str] = (),
    ) -> list[str]:
        """A member (``mode`` "member") or the joiner ("join") of a join or state workload.

        ``discover`` is how many members JGroups 2.12's discovery waits for (``num_initial_members``): the
        members already there, so a joiner does not wait out the discovery timeout for itself.
        """
        if not self.lifecycle_class:
            raise BenchSetupError(f"{self.system}: no join/state harness")
        main = self._java(config, ports, rank, discover, self.lifecycle_class, jvm_extra)
        return [*main, cluster, mode, *options]


def _need(tool: str, hint: str) -> None:
    if shutil.which(tool) is None:
        raise BenchSetupError(f"{tool} not found on PATH: {hint}")


def maven_classpath(
    src: Path, files: list[Path], name: str, jar: str, what: str, log: Callable[[str], None] | None
) -> str:
    """Build the Maven project ``src`` (its pom.xml and src/) into the cache, in a folder named ``name`` plus a
    hash of ``files``, offline first; returns the class path of target/``jar`` and its libraries."""
    out = cache_root() / f"{name}-{_digest(files, src)}"
    jar_path = out / "target" / jar
    if not jar_path.is_file():
        _need("mvn", "install Maven (Debian: apt-get install maven) and a JDK >= 17")
        _need("java", "install a JDK >= 17")
        if log:
            log(f"building {what} with Maven into {out} (once)")
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        shutil.copy2(src / "pom.xml", out / "pom.xml")
        shutil.copytree(src / "src", out / "src")
        build_log = out / "build.log"
        if not _run(["mvn", "-B", "-q", "-o", "package"], out, build_log) and not _run(
            ["mvn", "-B", "-q", "package"], out, build_log
        ):
            tail = "\n".join(build_log.read_text(errors="replace").splitlines()[-15:])
            raise BenchSetupError(f"{what} did not build (log {build_log}):\n{tail}")
    libs = sorted((out / "target" / "lib").glob("*.jar"))
    return os.pathsep.join(map(str, [jar_path, *libs]))


def jgroups5(log: Callable[[str], None] | None = None) -> JavaPeer:
    """The JGroups 5 harness, built with Maven on first use."""
    src = harness_dir()
    files = [src / "pom.xml", *_sources(src, "src")]
    classpath = maven_classpath(src, files, "jgroups5", "jgroups-harness.jar", "the JGroups 5 harness", log)
    return JavaPeer(
        "jgroups-5", classpath, "io.groupcluster.bench.Harness", src / "conf", "io.groupcluster.bench.Lifecycle"
    )


def jgroups5_jar(peer: JavaPeer) -> Path:
    """The JGroups 5 jar on the harness's class path (Maven copies it to target/lib)."""
    for entry in peer.classpath.split(os.pathsep):
        name = Path(entry).name
        if name.startswith("jgroups-") and name.endswith(".jar") and "harness" not in name:
            return Path(entry)
    raise BenchSetupError(f"no JGroups jar on the class path {peer.classpath}")


def stock_xml(peer: JavaPeer, name: str) -> str:
    """The text of ``name`` (``tcp.xml``, ``tcp-new.xml``) exactly as shipped in the JGroups 5 jar."""
    with zipfile.ZipFile(jgroups5_jar(peer)) as jar:
        return jar.read(name).decode("utf-8")


def _jgroups212_jar(log: Callable[[str], None] | None) -> Path:
    for jar in JGROUPS_212_JARS:
        if jar.is_file():
            return jar
    if os.geteuid() == 0 and shutil.which("apt-get"):
        if log:
            log("installing Debian's libjgroups-java (JGroups 2.12)")
        subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "libjgroups-java"], check=False, capture_output=True)
        for jar in JGROUPS_212_JARS:
            if jar.is_file():
                return jar
    raise BenchSetupError("JGroups 2.12 not found: apt-get install libjgroups-java (Debian) provides it")


def jgroups212(log: Callable[[str], None] | None = None) -> JavaPeer:
    """The JGroups 2.12 harness, compiled with javac against Debian's jar on first use."""
    src = harness_dir()
    jar = _jgroups212_jar(log)
    files = [*_sources(src, "src", "src-2.12")]
    out = cache_root() / f"jgroups212-{_digest(files, src)}"
    classes = out / "classes"
    marker = classes / "io" / "groupcluster" / "bench" / "Lifecycle212.class"
    if not marker.is_file():
        _need("javac", "install a JDK >= 17")
        if log:
            log(f"compiling the JGroups 2.12 harness into {out} (once)")
        classes.mkdir(parents=True, exist_ok=True)
        shared = src / "src" / "main" / "java" / "io" / "groupcluster" / "bench"
        entries = src / "src-2.12" / "io" / "groupcluster" / "bench"
        files = [shared / "Core.java", shared / "LifecycleCore.java"]
        files += [entries / "Harness212.java", entries / "Lifecycle212.java"]
        build_log = out / "build.log"
        if not _run(["javac", "-nowarn", "-d", str(classes), "-cp", str(jar), *map(str, files)], out, build_log):
            raise BenchSetupError(f"the JGroups 2.12 harness did not compile (log {build_log})")
    classpath = os.pathsep.join([str(classes), str(jar)])
    return JavaPeer(
        "jgroups-2.12",
        classpath,
        "io.groupcluster.bench.Harness212",
        src / "conf",
        "io.groupcluster.bench.Lifecycle212",
    )
