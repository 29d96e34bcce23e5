"""Start, stop and inspect one local control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and the node agent, all on 127.0.0.1, with state (certificates, etcd data, logs, pids,
kubeconfigs) in one directory.

Several independent instances can run at once: each has its own state directory
(``LOCAL_KUBE_STATE_DIR``) and picks free ports when it starts. Every process started here, and every pod
process the node agent starts, carries ``LOCALKUBE_OWNER=<state dir>`` in its environment, so ``down``
can find and stop exactly what this instance started, even after a crash lost a pid file.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from . import build, pki

OWNER_ENV = "LOCALKUBE_OWNER"
NODE_NAME = "localkube-node"
SERVICE_CIDR = "10.96.0.0/16"
# The cluster IP the apiserver gives the `kubernetes` service (first of SERVICE_CIDR); only a SAN here,
# nothing routes to it (there is no kube-proxy), and the pods are told 127.0.0.1 instead.
KUBERNETES_SERVICE_IP = "10.96.0.1"
# Stop order: the agent first (it stops the pods), the control loops, then the API server, then etcd.
STOP_ORDER = ("node-agent", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")


def default_state_dir() -> Path:
    env = os.environ.get("LOCAL_KUBE_STATE_DIR")
    if env:
        return Path(env).resolve()
    return build.cache_root() / "local-kube" / "default"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ControlPlane:
    """One local cluster rooted at a state directory."""

    def __init__(self, state_dir: Path | str | None = None) -> None:
        self.dir = Path(state_dir).resolve() if state_dir else default_state_dir()
        self.pki = self.dir / "pki"
        self.logs = self.dir / "logs"
        self.pids = self.dir / "pids"
        self.state_file = self.dir / "state.json"
        self.kubeconfig = self.dir / "admin.kubeconfig"

    # ---------------------------------------------------------------- state
    def state(self) -> dict[str, Any]:
        if self.state_file.exists():
            return json.loads(self.state_file.read_text())
        return {}

    def _save_state(self, st: dict[str, Any]) -> None:
        self.state_file.write_text(json.dumps(st, indent=2))

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[OWNER_ENV] = str(self.dir)
        return env

    # ---------------------------------------------------------------- processes
    def _start(self, name: str, argv: list[str], extra_env: dict[str, str] | None = None) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pids.mkdir(parents=True, exist_ok=True)
        env = self._env()
        if extra_env:
            env.update(extra_env)
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            # A new session makes the process its own group leader, so `down` can signal the whole
            # group and the daemon does not die with the terminal (or pytest) that started it.
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                cwd=self.dir,
            )
        finally:
            log.close()
        (self.pids / f"{name}.pid").write_text(str(proc.pid))
        return proc.pid

    def _pid(self, name: str) -> int | None:
        p = self.pids / f"{name}.pid"
        try:
            return int(p.read_text())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A zombie still answers kill(0); it has exited for our purposes.
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def owned_pids(self) -> list[int]:
        """Every live process whose environment names this state directory as its owner."""
        marker = f"{OWNER_ENV}={self.dir}".encode()
        me = os.getpid()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if marker in env and self._alive(int(entry)):
                found.append(int(entry))
        return found

    def _stop_group(self, pid: int, grace: float) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                return
            except PermissionError:
                os.kill(pid, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                if not self._alive(pid):
                    return
                time.sleep(0.05)

    # ---------------------------------------------------------------- certificates
    def _pki(self, api_port: int) -> dict[str, Path]:
        ca = pki.CA(self.pki)
        out: dict[str, Path] = {"ca": ca.cert_path, "ca_key": ca.key_path}
        crt, key = ca.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            dns=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=("127.0.0.1", KUBERNETES_SERVICE_IP),
        )
        out["apiserver_crt"], out["apiserver_key"] = crt, key
        # The apiserver's identity when it calls the node agent (logs) — a real kubelet checks this too.
        crt, key = ca.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",), client=True
        )
        out["kubelet_client_crt"], out["kubelet_client_key"] = crt, key
        out["sa_key"], out["sa_pub"] = pki.service_account_keys(self.pki)
        # A separate CA for the aggregation layer's front proxy, as kubeadm sets it up; without it the
        # components log errors about the empty requestheader client CA.
        fp = pki.CA(self.pki, "front-proxy-ca", "localkube-front-proxy-ca")
        out["front_proxy_ca"] = fp.cert_path
        out["front_proxy_crt"], out["front_proxy_key"] = fp.issue(
            "front-proxy-client", "front-proxy-client", client=True
        )
        server = f"https://127.0.0.1:{api_port}"
        idents = {
            "admin": ("kubernetes-admin", ("system:masters",)),
            "controller-manager": ("system:kube-controller-manager", ()),
            "scheduler": ("system:kube-scheduler", ()),
            "node": (f"system:node:{NODE_NAME}", ("system:nodes",)),
        }
        for stem, (cn, orgs) in idents.items():
            crt, key = ca.issue(stem, cn, orgs, client=True)
            out[f"{stem}_crt"], out[f"{stem}_key"] = crt, key
            kc = self.kubeconfig if stem == "admin" else self.dir / f"{stem}.kubeconfig"
            pki.write_kubeconfig(kc, server, ca.cert_path, crt, key, cn)
            out[f"{stem}_kubeconfig"] = kc
        # The node agent's serving certificate (for `kubectl logs` through the apiserver).
        crt, key = ca.issue(
            "node-serving",
            f"system:node:{NODE_NAME}",
            ("system:nodes",),
            server=True,
            ips=("127.0.0.1",),
            dns=("localhost", NODE_NAME),
        )
        out["node_serving_crt"], out["node_serving_key"] = crt, key
        return out

    # ---------------------------------------------------------------- API helpers
    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def api_get(self, path: str, timeout: float = 5.0) -> tuple[int, Any]:
        port = self.state()["ports"]["apiserver"]
        req = urllib.request.Request(f"https://127.0.0.1:{port}{path}")
        try:
            with urllib.request.urlopen(req, context=self._ssl(), timeout=timeout) as r:
                body = r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body.decode(errors="replace")

    def _wait(self, what: str, check, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            self._check_processes()
            try:
                ok = check()
            except (OSError, urllib.error.URLError, KeyError) as e:
                ok, last = False, e
            if ok:
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last})")

    def _check_processes(self) -> None:
        for name in self.state().get("components", []):
            pid = self._pid(name)
            if pid is not None and not self._alive(pid):
                tail = self._log_tail(name)
                raise RuntimeError(f"{name} exited during start-up; end of {self.logs / (name + '.log')}:\n{tail}")

    def _log_tail(self, name: str, lines: int = 25) -> str:
        try:
            return "\n".join((self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _node_ready(self) -> bool:
        code, body = self.api_get(f"/api/v1/nodes/{NODE_NAME}")
        if code != 200:
            return False
        conds = body.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    # ---------------------------------------------------------------- up / down
    def up(self, timeout: float = 180.0) -> Path:
        """Start everything (after `down` of any previous run in this dir); return the admin kubeconfig."""
        if self.owned_pids():
            self.down(quiet=True)
        bins = build.bin_dir()
        missing = build.missing_binaries()
        if missing:
            raise SystemExit(f"local-kube up: missing {', '.join(missing)} in {bins}; run `scripts/local-kube build`")
        v = build.read_versions()
        self.dir.mkdir(parents=True, exist_ok=True)
        for p in self.pids.glob("*.pid"):
            p.unlink()
        ports = {
            n: _free_port() for n in ("etcd", "etcd_peer", "apiserver", "controller_manager", "scheduler", "kubelet")
        }
        server = f"https://127.0.0.1:{ports['apiserver']}"
        st: dict[str, Any] = {
            "ports": ports,
            "server": server,
            "node": NODE_NAME,
            "components": [],
            "version": v["KUBERNETES_VERSION"],
            "bin_dir": str(bins),
        }
        self._save_state(st)
        certs = self._pki(ports["apiserver"])
        etcd_data = self.dir / "etcd-data"
        # Fresh cluster each time: tests must not see objects from an earlier session.
        if etcd_data.exists():
            subprocess.run(["rm", "-rf", str(etcd_data)], check=True)
        try:
            self._start_all(bins, ports, certs, st, v)
        except BaseException:
            self.down(quiet=True)
            raise
        return self.kubeconfig

    def _start_all(
        self, bins: Path, ports: dict[str, int], certs: dict[str, Path], st: dict[str, Any], v: dict[str, str]
    ) -> None:
        def started(name: str) -> None:
            st["components"].append(name)
            self._save_state(st)

        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        peer_url = f"http://127.0.0.1:{ports['etcd_peer']}"
        self._start(
            "etcd",
            [
                str(bins / "etcd"),
                "--name=localkube",
                f"--data-dir={self.dir / 'etcd-data'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=localkube={peer_url}",
                "--initial-cluster-state=new",
                # Throw-away test data: skipping fsync makes the apiserver several times faster on slow disks.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        started("etcd")
        self._wait("etcd", lambda: urllib.request.urlopen(f"{etcd_url}/health", timeout=2).status == 200, 30)

        self._start(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={ports['apiserver']}",
                f"--tls-cert-file={certs['apiserver_crt']}",
                f"--tls-private-key-file={certs['apiserver_key']}",
                f"--client-ca-file={certs['ca']}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--service-account-issuer={st['server']}",
                f"--service-account-key-file={certs['sa_pub']}",
                f"--service-account-signing-key-file={certs['sa_key']}",
                "--authorization-mode=Node,RBAC",
                f"--requestheader-client-ca-file={certs['front_proxy_ca']}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={certs['front_proxy_crt']}",
                f"--proxy-client-key-file={certs['front_proxy_key']}",
                # The default plugins stay on; NodeRestriction (as kubeadm enables it) keeps the agent honest.
                "--enable-admission-plugins=NodeRestriction",
                # The `kubernetes` Endpoints would carry 127.0.0.1, which Endpoints validation rejects.
                "--endpoint-reconciler-type=none",
                f"--kubelet-client-certificate={certs['kubelet_client_crt']}",
                f"--kubelet-client-key={certs['kubelet_client_key']}",
                f"--kubelet-certificate-authority={certs['ca']}",
                "--kubelet-preferred-address-types=InternalIP",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
            ],
        )
        started("kube-apiserver")
        self._wait("kube-apiserver /readyz", lambda: self.api_get("/readyz")[0] == 200, 90)

        cm_kc = certs["controller-manager_kubeconfig"]
        self._start(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"),
                f"--kubeconfig={cm_kc}",
                f"--authentication-kubeconfig={cm_kc}",
                f"--authorization-kubeconfig={cm_kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['controller_manager']}",
                f"--service-account-private-key-file={certs['sa_key']}",
                f"--root-ca-file={certs['ca']}",
                "--use-service-account-credentials=true",
                f"--cluster-signing-cert-file={certs['ca']}",
                f"--cluster-signing-key-file={certs['ca_key']}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--cert-dir={self.dir / 'kube-controller-manager-certs'}",
                "--controllers=*",
                "--leader-elect=false",
                "--v=1",
            ],
        )
        started("kube-controller-manager")

        sc_kc = certs["scheduler_kubeconfig"]
        self._start(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"),
                f"--kubeconfig={sc_kc}",
                f"--authentication-kubeconfig={sc_kc}",
                f"--authorization-kubeconfig={sc_kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['scheduler']}",
                f"--cert-dir={self.dir / 'kube-scheduler-certs'}",
                "--leader-elect=false",
                "--v=1",
            ],
        )
        started("kube-scheduler")

        scripts_dir = Path(__file__).resolve().parents[1]
        pypath = os.pathsep.join(filter(None, [str(scripts_dir), os.environ.get("PYTHONPATH", "")]))
        self._start(
            "node-agent",
            [
                sys.executable,
                "-m",
                "localkube.node_agent",
                f"--state-dir={self.dir}",
                f"--server={st['server']}",
                f"--node-name={NODE_NAME}",
                f"--ca={certs['ca']}",
                f"--cert={certs['node_crt']}",
                f"--key={certs['node_key']}",
                f"--serving-cert={certs['node_serving_crt']}",
                f"--serving-key={certs['node_serving_key']}",
                f"--kubelet-port={ports['kubelet']}",
                f"--kubelet-version={v['KUBERNETES_VERSION']}",
            ],
            extra_env={"PYTHONPATH": pypath},
        )
        started("node-agent")
        self._wait(f"node {NODE_NAME} Ready", self._node_ready, 60)
        # Pods are rejected until the ServiceAccount controller has made `default` in the namespace.
        self._wait(
            "service account default/default",
            lambda: self.api_get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
            60,
        )

    def down(self, quiet: bool = False) -> list[int]:
        """Stop every process this instance started; return the pids that had to be swept up."""
        for name in STOP_ORDER:
            pid = self._pid(name)
            if pid is not None:
                # The agent gets time to stop pods gracefully; the others stop within a second or two.
                self._stop_group(pid, 15.0 if name == "node-agent" else 10.0)
                (self.pids / f"{name}.pid").unlink(missing_ok=True)
        leftovers = self.owned_pids()
        for pid in leftovers:
            self._stop_group(pid, 2.0)
        still = self.owned_pids()
        if still:
            raise RuntimeError(f"local-kube down: processes {still} of {self.dir} would not stop")
        if not quiet:
            print(f"local-kube down: stopped ({self.dir})")
        return leftovers

    def status(self) -> dict[str, Any]:
        st = self.state()
        procs = {}
        for name in st.get("components", []):
            pid = self._pid(name)
            procs[name] = {"pid": pid, "alive": bool(pid and self._alive(pid))}
        out: dict[str, Any] = {
            "state_dir": str(self.dir),
            "kubeconfig": str(self.kubeconfig),
            "processes": procs,
        }
        if st and any(p["alive"] for p in procs.values()):
            try:
                out["readyz"] = self.api_get("/readyz")[0]
                out["node_ready"] = self._node_ready()
            except OSError as e:
                out["readyz"] = f"unreachable: {e}"
        out["owned_pids"] = self.owned_pids()
        return out
