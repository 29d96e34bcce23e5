"""The local node agent: stands in for kubelet and a container runtime on one machine.

It registers a Node, keeps it Ready (a Lease heartbeat and periodic status), watches the pods bound to
it (``fieldSelector=spec.nodeName=<node>``) and runs each container as a local process with the
container's command and args. Each pod gets its own loopback address (127.0.0.x, x from 10 up, reused
when freed) that its processes are told to bind to (``POD_IP``). The agent writes the pod's projected
service-account token (from the TokenRequest API, bound to the pod), configMap, secret and downward-API
volumes into per-pod directories, reports phase, IPs, container states and conditions through the
``pods/status`` subresource, runs HTTP/TCP/exec readiness, liveness and startup probes, honours
restartPolicy, and stops pods on deletion with SIGTERM, the grace period and SIGKILL before it removes
them from the API. A small HTTPS endpoint serves container logs so ``kubectl logs`` works.

It talks to the API server as ``system:node:<name>`` with a client certificate, so the Node authorizer
and the NodeRestriction admission plugin judge it exactly as they judge a kubelet.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import shutil
import signal
import ssl
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from . import podspec

log = logging.getLogger("localkube.node_agent")

HOST_IP = "127.0.0.1"
LEASE_SECONDS = 40
LEASE_RENEW = 10.0
NODE_STATUS_EVERY = 60.0
BACKOFF_START = 1.0
BACKOFF_MAX = 60.0


class ApiError(Exception):
    def __init__(self, status: int, body: str, what: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {body[:300]}")
        self.status = status


class Api:
    """Minimal async client of the Kubernetes API over HTTPS with a client certificate."""

    def __init__(self, server: str, ca: str, cert: str, key: str) -> None:
        self.server = server.rstrip("/")
        self.ssl = ssl.create_default_context(cafile=ca)
        self.ssl.load_cert_chain(cert, key)
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Api:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl, limit=20))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session:
            await self.session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
        ok: tuple[int, ...] = (200, 201),
    ) -> Any:
        assert self.session is not None
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        timeout = aiohttp.ClientTimeout(total=30)
        async with self.session.request(
            method, self.server + path, data=data, headers=headers, params=params, timeout=timeout
        ) as r:
            text = await r.text()
            if r.status not in ok:
                raise ApiError(r.status, text, f"{method} {path}")
            return json.loads(text) if text else None

    async def watch(self, path: str, params: dict[str, str]):
        """Yield watch events (dicts) until the server ends the stream."""
        assert self.session is not None
        timeout = aiohttp.ClientTimeout(total=None, sock_read=LEASE_SECONDS * 10)
        async with self.session.get(self.server + path, params={**params, "watch": "1"}, timeout=timeout) as r:
            if r.status != 200:
                raise ApiError(r.status, await r.text(), f"WATCH {path}")
            buf = b""
            # Split on newlines ourselves: a pod with many managed fields can exceed readline()'s limit.
            async for chunk in r.content.iter_any():
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)


class IPPool:
    """Loopback addresses for pods: <prefix>.10 upward, lowest free first, so freed ones are reused."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.used: set[int] = set()

    def allocate(self) -> str:
        for x in range(10, 255):
            if x not in self.used:
                self.used.add(x)
                return f"{self.prefix}.{x}"
        raise RuntimeError("no free pod address left")

    def release(self, ip: str) -> None:
        with contextlib.suppress(ValueError):
            self.used.discard(int(ip.rsplit(".", 1)[1]))


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class Container:
    """One container of a pod: its process, restarts, probes and reported state."""

    def __init__(self, pod: PodWorker, spec: dict[str, Any], init: bool = False) -> None:
        self.pod = pod
        self.spec = spec
        self.name: str = spec["name"]
        self.init = init
        self.proc: asyncio.subprocess.Process | None = None
        self.state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict[str, Any] = {}
        self.restart_count = 0
        self.ready = False
        self.started = False
        self.stopping = False
        self.start_id = ""
        self.probe_tasks: list[asyncio.Task[None]] = []
        self.killed_for = ""

    # -------------------------------------------------------------- process
    async def _spawn(self) -> None:
        env = self.pod.container_env(self.spec)
        argv = podspec.resolve_argv(self.spec, env)
        workdir = self.spec.get("workingDir")
        # Local files, once per container start, before the child exists: nothing on the loop waits on them.
        cwd = workdir if workdir and os.path.isdir(workdir) else str(self.pod.dir)  # noqa: ASYNC240
        logf = open(self.pod.log_path(self.name), "ab")  # noqa: SIM115, ASYNC230 - the child owns a copy of the fd
        try:
            # Own session: signals reach the whole process group (a shell and its children).
            self.proc = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                cwd=cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=logf,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            logf.close()
        (self.pod.dir / f"{self.name}.pid").write_text(str(self.proc.pid))
        log.info("pod %s container %s started pid %d: %s", self.pod.key, self.name, self.proc.pid, argv)

    async def run(self) -> None:
        """Run, restart per restartPolicy, until stopped or finished for good."""
        backoff = BACKOFF_START
        policy = self.pod.spec.get("restartPolicy", "Always")
        while not self.stopping:
            self.ready = False
            self.started = False
            self.killed_for = ""
            started_at = podspec.now_rfc3339()
            t0 = time.monotonic()
            try:
                await self._spawn()
            except (OSError, ValueError) as e:
                exit_code, reason, message = 128, "StartError", str(e)
                log.warning("pod %s container %s failed to start: %s", self.pod.key, self.name, e)
                self.state = {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": reason,
                        "message": message,
                        "startedAt": started_at,
                        "finishedAt": podspec.now_rfc3339(),
                    }
                }
            else:
                assert self.proc is not None
                self.start_id = f"localkube://{self.pod.uid[:8]}-{self.name}-{self.restart_count}-{self.proc.pid}"
                self.state = {"running": {"startedAt": started_at}}
                self._start_probes()
                self.pod.changed()
                code = await self.proc.wait()
                self._stop_probes()
                (self.pod.dir / f"{self.name}.pid").unlink(missing_ok=True)
                # A negative return code is death by signal; report it as a shell would (128+n).
                exit_code = code if code >= 0 else 128 - code
                reason = "Completed" if exit_code == 0 else "Error"
                if self.killed_for:
                    reason = self.killed_for
                self.state = {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": reason,
                        "startedAt": started_at,
                        "finishedAt": podspec.now_rfc3339(),
                        "containerID": self.start_id,
                    }
                }
            self.ready = False
            self.pod.changed()
            if self.stopping:
                return
            restart = policy == "Always" or (policy == "OnFailure" and exit_code != 0)
            if self.init:
                # Init containers never restart on success; on failure they follow the pod's policy
                # (Always counts as OnFailure for them).
                restart = exit_code != 0 and policy != "Never"
            if not restart:
                return
            # A container that ran for a while is not crash-looping: start the back-off afresh.
            if time.monotonic() - t0 > 2 * BACKOFF_MAX:
                backoff = BACKOFF_START
            self.last_state = self.state
            self.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {backoff:.0f}s restarting failed container",
                }
            }
            self.restart_count += 1
            self.pod.changed()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.pod.stop_event.wait(), backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    async def kill(self, grace: float, reason: str = "") -> None:
        """SIGTERM the process group, wait up to grace seconds, then SIGKILL."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        if reason:
            self.killed_for = reason
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), max(grace, 0.0))
        except TimeoutError:
            log.info("pod %s container %s did not stop in %.0fs: SIGKILL", self.pod.key, self.name, grace)
        # SIGKILL the group even after the leader exited: children it left behind must not outlive the pod.
        _signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), 5)

    # -------------------------------------------------------------- probes
    def _start_probes(self) -> None:
        startup = self.spec.get("startupProbe")
        if not startup:
            self.started = True
        ready_probe = self.spec.get("readinessProbe")
        if not ready_probe and not self.init:
            self.ready = True
        self.probe_tasks = [
            asyncio.create_task(self._probe_loop(kind, p))
            for kind, p in (
                ("startup", startup),
                ("readiness", ready_probe),
                ("liveness", self.spec.get("livenessProbe")),
            )
            if p
        ]

    def _stop_probes(self) -> None:
        for t in self.probe_tasks:
            t.cancel()
        self.probe_tasks = []

    async def _probe_loop(self, kind: str, probe: dict[str, Any]) -> None:
        period = float(probe.get("periodSeconds", 10))
        timeout = float(probe.get("timeoutSeconds", 1))
        fail_max = int(probe.get("failureThreshold", 3))
        ok_min = int(probe.get("successThreshold", 1))
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        if kind != "startup":
            # started is a flag that goes up and down with restarts; a probe's start may lag by 0.2 s.
            while not self.started:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
        oks = fails = 0
        while True:
            ok, why = await self._probe_once(probe, timeout)
            if ok:
                oks, fails = oks + 1, 0
            else:
                oks, fails = 0, fails + 1
            if kind == "startup":
                if ok:
                    self.started = True
                    self.pod.changed()
                    return
                if fails >= fail_max:
                    log.info("pod %s container %s startup probe failed: %s", self.pod.key, self.name, why)
                    await asyncio.shield(self.kill(self.pod.grace(), "StartupProbeFailed"))
                    return
            elif kind == "readiness":
                if ok and oks >= ok_min and not self.ready:
                    self.ready = True
                    self.pod.changed()
                elif not ok and fails >= fail_max and self.ready:
                    self.ready = False
                    self.pod.changed()
            elif not ok and fails >= fail_max:
                log.info("pod %s container %s liveness probe failed: %s", self.pod.key, self.name, why)
                # Shielded: run() cancels the probe tasks as soon as the process exits, and the kill must
                # still finish (SIGKILL of the leftover process group).
                await asyncio.shield(self.kill(self.pod.grace(), "LivenessProbeFailed"))
                return
            await asyncio.sleep(period)

    # A timeout parameter (ASYNC109): the probe's timeoutSeconds; running out is a failed probe, not an error.
    async def _probe_once(self, probe: dict[str, Any], timeout: float) -> tuple[bool, str]:  # noqa: ASYNC109
        try:
            if "httpGet" in probe:
                g = probe["httpGet"]
                host = g.get("host") or self.pod.ip
                if not host.startswith("127."):
                    # Pods live on loopback here; a probe elsewhere would leave the machine.
                    return False, f"probe host {host} is not a loopback address"
                port = podspec.probe_port(self.spec, g.get("port", 80))
                scheme = g.get("scheme", "HTTP").lower()
                path = g.get("path", "/")
                headers = {h["name"]: h["value"] for h in g.get("httpHeaders", [])}
                async with (
                    aiohttp.ClientSession() as s,
                    s.get(
                        f"{scheme}://{host}:{port}{path}",
                        headers=headers,
                        ssl=False,
                        allow_redirects=False,
                        timeout=aiohttp.ClientTimeout(total=timeout),
                    ) as r,
                ):
                    return 200 <= r.status < 400, f"HTTP {r.status}"
            if "tcpSocket" in probe:
                t = probe["tcpSocket"]
                host = t.get("host") or self.pod.ip
                if not host.startswith("127."):
                    return False, f"probe host {host} is not a loopback address"
                port = podspec.probe_port(self.spec, t["port"])
                _, w = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
                w.close()
                return True, "connected"
            if "exec" in probe:
                env = self.pod.container_env(self.spec)
                p = await asyncio.create_subprocess_exec(
                    *probe["exec"]["command"],
                    env=env,
                    cwd=str(self.pod.dir),
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                    start_new_session=True,
                )
                try:
                    code = await asyncio.wait_for(p.wait(), timeout)
                except TimeoutError:
                    _signal_group(p.pid, signal.SIGKILL)
                    await p.wait()
                    return False, "exec probe timed out"
                return code == 0, f"exit {code}"
            return True, "no handler"
        except (TimeoutError, OSError, aiohttp.ClientError, ValueError) as e:
            return False, f"{type(e).__name__}: {e}"

    # -------------------------------------------------------------- status
    def status(self) -> dict[str, Any]:
        st: dict[str, Any] = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "localkube://" + self.spec.get("image", ""),
            "ready": self.ready,
            "started": "running" in self.state and self.started,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.start_id:
            st["containerID"] = self.start_id
        return st


class PodWorker:
    """Runs one pod from first sight to removal."""

    def __init__(self, agent: Agent, pod: dict[str, Any]) -> None:
        self.agent = agent
        self.pod = pod
        self.uid: str = pod["metadata"]["uid"]
        self.key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        self.dir = agent.state_dir / "pods" / self.uid
        self.ip = ""
        self.stop_event = asyncio.Event()
        self.dirty = asyncio.Event()
        self.containers: list[Container] = []
        self.init_containers: list[Container] = []
        self.volume_env: dict[str, str] = {}
        self.start_time = ""
        self.initialized = False
        self.deleting = False
        self.gone = False
        # Keep the scheduler's PodScheduled condition (its transition time) as it wrote it.
        self.conditions: dict[str, dict[str, Any]] = {
            c["type"]: c for c in pod.get("status", {}).get("conditions", []) if c.get("type") == "PodScheduled"
        }
        self.task: asyncio.Task[None] | None = None
        self.last_reported: Any = None
        self.token_task: asyncio.Task[None] | None = None

    @property
    def spec(self) -> dict[str, Any]:
        return self.pod["spec"]

    def log_path(self, container: str) -> Path:
        d = (
            self.agent.state_dir / "logs" / "pods" / f"{self.pod['metadata']['namespace']}_"
            f"{self.pod['metadata']['name']}_{self.uid}"
        )
        d.mkdir(parents=True, exist_ok=True)
        return d / f"{container}.log"

    def grace(self) -> float:
        return float(self.spec.get("terminationGracePeriodSeconds", 30))

    def changed(self) -> None:
        self.dirty.set()

    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        if pod["metadata"].get("deletionTimestamp") and not self.deleting:
            self.deleting = True
            self.stop_event.set()
            self.changed()

    # -------------------------------------------------------------- environment
    def container_env(self, c: dict[str, Any]) -> dict[str, str]:
        pod_for_refs = {
            **self.pod,
            "status": {**self.pod.get("status", {}), "podIP": self.ip, "podIPs": [{"ip": self.ip}]},
        }
        extra_path = [str(podspec.venv_bin())] if podspec.is_project_image(c.get("image", "")) else []
        env = podspec.base_env(self.ip, extra_path)
        env.update(
            {
                "HOSTNAME": self.pod["metadata"]["name"],
                "KUBERNETES_SERVICE_HOST": HOST_IP,
                "KUBERNETES_SERVICE_PORT": str(self.agent.api_port),
                "KUBERNETES_SERVICE_PORT_HTTPS": str(self.agent.api_port),
                # Marks the process as belonging to this local cluster: `local-kube down` sweeps by it.
                "LOCALKUBE_OWNER": str(self.agent.state_dir),
                "LOCALKUBE_POD_UID": self.uid,
            }
        )
        env.update(self.volume_env)
        for ef in c.get("envFrom", []):
            prefix = ef.get("prefix", "")
            data = self.agent.cache_get(self.pod["metadata"]["namespace"], ef)
            for k, v in data.items():
                env[prefix + k] = v
        for e in c.get("env", []):
            name = e["name"]
            if "value" in e:
                env[name] = podspec.expand(str(e["value"]), env)
                continue
            vf = e.get("valueFrom", {})
            if "fieldRef" in vf:
                env[name] = podspec.field_ref(pod_for_refs, vf["fieldRef"]["fieldPath"], self.agent.node_name, HOST_IP)
            elif "resourceFieldRef" in vf:
                ref = vf["resourceFieldRef"]
                target = c
                if ref.get("containerName"):
                    target = next((x for x in self.spec.get("containers", []) if x["name"] == ref["containerName"]), c)
                env[name] = podspec.resource_field_ref(target, ref, self.agent.allocatable)
            elif "configMapKeyRef" in vf or "secretKeyRef" in vf:
                ref_value = self.agent.key_ref(self.pod["metadata"]["namespace"], vf)
                if ref_value is not None:
                    env[name] = ref_value
            else:
                env[name] = ""
        # Mount paths are not honoured here, so where a volume really is wins over a pod's own value for the
        # same name (a pod that sets GROUPCLUSTER_VOLUME_<NAME> to the volume's mountPath runs on both).
        env.update(self.volume_env)
        return env

    # -------------------------------------------------------------- volumes
    async def _prepare_volumes(self) -> None:
        await self.agent._prefetch_env_objects(self.pod)
        ns = self.pod["metadata"]["namespace"]
        vols_dir = self.dir / "volumes"
        vols_dir.mkdir(parents=True, exist_ok=True)
        mounts = {m["name"]: m["mountPath"] for c in self.spec.get("containers", []) for m in c.get("volumeMounts", [])}
        for vol in self.spec.get("volumes", []):
            vname = vol["name"]
            d = vols_dir / vname
            d.mkdir(exist_ok=True)
            files: dict[str, bytes] = {}
            if "projected" in vol:
                for src in vol["projected"].get("sources", []):
                    files.update(await self._projected_source(ns, src))
            elif "configMap" in vol:
                files.update(await self._object_files(ns, "configmaps", vol["configMap"]))
            elif "secret" in vol:
                files.update(
                    await self._object_files(ns, "secrets", {**vol["secret"], "name": vol["secret"]["secretName"]})
                )
            elif "downwardAPI" in vol:
                files.update(self._downward_files(vol["downwardAPI"].get("items", [])))
            # emptyDir and anything else: an empty per-pod directory.
            for rel, content in files.items():
                p = d / rel
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(content)
            self.volume_env[f"GROUPCLUSTER_VOLUME_{podspec.env_key(vname)}"] = str(d)
            if mounts.get(vname) == podspec.SA_MOUNT_PATH:
                self.volume_env["GROUPCLUSTER_SA_DIR"] = str(d)

    async def _projected_source(self, ns: str, src: dict[str, Any]) -> dict[str, bytes]:
        if "serviceAccountToken" in src:
            sat = src["serviceAccountToken"]
            token, expiry = await self._request_token(sat)
            self.token_task = self.token_task or asyncio.create_task(self._refresh_token(sat, expiry))
            return {sat.get("path", "token"): token.encode()}
        if "configMap" in src:
            return await self._object_files(ns, "configmaps", src["configMap"])
        if "secret" in src:
            return await self._object_files(ns, "secrets", src["secret"])
        if "downwardAPI" in src:
            return self._downward_files(src["downwardAPI"].get("items", []))
        return {}

    async def _request_token(self, sat: dict[str, Any]) -> tuple[str, float]:
        meta = self.pod["metadata"]
        sa = self.spec.get("serviceAccountName", "default")
        spec: dict[str, Any] = {
            "expirationSeconds": int(sat.get("expirationSeconds", 3607)),
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
        }
        if sat.get("audience"):
            spec["audiences"] = [sat["audience"]]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        res = await self.agent.api.request(
            "POST", f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token", body
        )
        return res["status"]["token"], time.monotonic() + spec["expirationSeconds"]

    async def _refresh_token(self, sat: dict[str, Any], expiry: float) -> None:
        # The kubelet rotates a projected token at 80% of its lifetime; so do we, in place.
        path = sat.get("path", "token")
        vol = next(
            (
                v["name"]
                for v in self.spec.get("volumes", [])
                if "projected" in v and any("serviceAccountToken" in s for s in v["projected"].get("sources", []))
            ),
            None,
        )
        while vol:
            life = expiry - time.monotonic()
            await asyncio.sleep(max(life * 0.8, 30))
            try:
                token, expiry = await self._request_token(sat)
            except (ApiError, aiohttp.ClientError, OSError) as e:
                log.warning("pod %s token refresh failed: %s", self.key, e)
                expiry = time.monotonic() + 60
                continue
            target = self.dir / "volumes" / vol / path
            tmp = target.with_suffix(".tmp")
            tmp.write_text(token)
            os.replace(tmp, target)

    async def _object_files(self, ns: str, kind: str, ref: dict[str, Any]) -> dict[str, bytes]:
        try:
            obj = await self.agent.api.request("GET", f"/api/v1/namespaces/{ns}/{kind}/{ref['name']}")
        except ApiError as e:
            if e.status == 404 and ref.get("optional"):
                return {}
            raise
        self.agent.objects[(ns, kind, ref["name"])] = obj
        data = _decoded(obj, kind)
        items = ref.get("items")
        if items:
            return {i["path"]: data[i["key"]] for i in items if i["key"] in data}
        return dict(data)

    def _downward_files(self, items: list[dict[str, Any]]) -> dict[str, bytes]:
        pod = {**self.pod, "status": {**self.pod.get("status", {}), "podIP": self.ip}}
        out = {}
        for it in items:
            if "fieldRef" in it:
                out[it["path"]] = podspec.field_ref(
                    pod, it["fieldRef"]["fieldPath"], self.agent.node_name, HOST_IP
                ).encode()
        return out

    # -------------------------------------------------------------- lifecycle
    async def run(self) -> None:
        try:
            await self._run()
        except Exception:
            log.exception("pod %s worker failed", self.key)
        finally:
            await self._teardown()

    async def _run(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ip = HOST_IP if self.spec.get("hostNetwork") else self.agent.ips.allocate()
        self.start_time = podspec.now_rfc3339()
        self.init_containers = [Container(self, c, init=True) for c in self.spec.get("initContainers", [])]
        self.containers = [Container(self, c) for c in self.spec.get("containers", [])]
        reporter = asyncio.create_task(self._reporter())
        await self._prepare_volumes_retrying()
        for ic in self.init_containers:
            if self.stop_event.is_set():
                break
            await ic.run()
            term = ic.state.get("terminated", {})
            if term.get("exitCode") != 0:
                self.changed()
                await self.stop_event.wait()
                break
        if not self.stop_event.is_set():
            self.initialized = True
            self.changed()
            runs = [asyncio.create_task(c.run()) for c in self.containers]
            stop = asyncio.create_task(self.stop_event.wait())
            await asyncio.wait([*runs, stop], return_when=asyncio.FIRST_COMPLETED)
            while not stop.done() and not all(t.done() for t in runs):
                await asyncio.wait([*runs, stop], return_when=asyncio.FIRST_COMPLETED)
            if self.stop_event.is_set():
                await self._stop_containers()
            for t in runs:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            stop.cancel()
        self.changed()
        if self.deleting and not self.gone:
            await self._report_now()
            await self._finalize_delete()
        elif not self.gone:
            # Terminal pod: report the final phase and keep nothing running.
            await self._report_now()
            await self.stop_event.wait()
            if self.deleting and not self.gone:
                await self._finalize_delete()
        reporter.cancel()

    async def _prepare_volumes_retrying(self) -> None:
        """Retry like the kubelet: right after binding, the Node authorizer may not yet know that this
        pod is ours (its graph is fed by informers) and refuses the token or configMap for a moment."""
        delay = 0.2
        while not self.stop_event.is_set():
            try:
                await self._prepare_volumes()
                return
            except (ApiError, aiohttp.ClientError, OSError, KeyError) as e:
                log.info("pod %s: volumes not ready yet (retrying in %.1fs): %s", self.key, delay, e)
                for c in self.containers:
                    c.state = {"waiting": {"reason": "ContainerCreating", "message": str(e)[:200]}}
                self.changed()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop_event.wait(), delay)
                delay = min(delay * 2, 10.0)

    async def _stop_containers(self, grace: float | None = None) -> None:
        if grace is None:
            dgp = self.pod["metadata"].get("deletionGracePeriodSeconds")
            grace = float(dgp) if dgp is not None else self.grace()
        for c in self.containers + self.init_containers:
            c.stopping = True
        await asyncio.gather(*(c.kill(grace) for c in self.containers + self.init_containers))

    async def _finalize_delete(self) -> None:
        meta = self.pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": self.uid},
        }
        try:
            await self.agent.api.request(
                "DELETE",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                body,
                ok=(200, 202, 404, 409),
            )
        except (ApiError, aiohttp.ClientError, OSError) as e:
            log.warning("pod %s final delete failed: %s", self.key, e)

    async def stop_now(self, grace: float) -> None:
        """Agent shutdown or the pod vanished: stop processes, no API calls."""
        self.gone = True
        self.stop_event.set()
        await self._stop_containers(grace)

    async def _teardown(self) -> None:
        if self.token_task:
            self.token_task.cancel()
        for c in self.containers + self.init_containers:
            c.stopping = True
            await c.kill(0)
        if self.ip and self.ip != HOST_IP:
            self.agent.ips.release(self.ip)
        # Secrets and tokens do not outlive the pod; its logs stay under logs/pods for debugging.
        shutil.rmtree(self.dir, ignore_errors=True)
        self.agent.workers.pop(self.uid, None)

    # -------------------------------------------------------------- status
    def _phase(self) -> str:
        cs = self.containers
        if not self.initialized:
            if (
                any(ic.state.get("terminated", {}).get("exitCode", 0) != 0 for ic in self.init_containers)
                and self.spec.get("restartPolicy", "Always") == "Never"
            ):
                return "Failed"
            return "Pending"
        if any("running" in c.state for c in cs):
            return "Running"
        terms = [c.state.get("terminated") for c in cs]
        if all(terms):
            pol = self.spec.get("restartPolicy", "Always")
            codes = [t["exitCode"] for t in terms if t]
            if pol == "Always" and not self.stop_event.is_set():
                return "Running"
            if pol == "OnFailure" and any(codes) and not self.stop_event.is_set():
                return "Running"
            return "Succeeded" if not any(codes) else "Failed"
        if any(c.restart_count > 0 for c in cs):
            return "Running"
        return "Pending"

    def _condition(self, ctype: str, ok: bool, reason: str = "") -> dict[str, Any]:
        status = "True" if ok else "False"
        old = self.conditions.get(ctype)
        if old is None or old["status"] != status:
            old = {
                "type": ctype,
                "status": status,
                "lastProbeTime": None,
                "lastTransitionTime": podspec.now_rfc3339(),
            }
            if reason:
                old["reason"] = reason
            self.conditions[ctype] = old
        return old

    def build_status(self) -> dict[str, Any]:
        phase = self._phase()
        all_ready = bool(self.containers) and all(c.ready for c in self.containers) and phase == "Running"
        terminal = phase in ("Succeeded", "Failed")
        conds = [
            self._condition("PodReadyToStartContainers", bool(self.ip) and not terminal),
            self._condition("Initialized", self.initialized, "" if self.initialized else "ContainersNotInitialized"),
            self._condition(
                "Ready",
                all_ready,
                "" if all_ready else ("PodCompleted" if terminal else "ContainersNotReady"),
            ),
            self._condition(
                "ContainersReady",
                all_ready,
                "" if all_ready else ("PodCompleted" if terminal else "ContainersNotReady"),
            ),
            self._condition("PodScheduled", True),
        ]
        st: dict[str, Any] = {
            "phase": phase,
            "conditions": conds,
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "startTime": self.start_time,
            "containerStatuses": [c.status() for c in self.containers],
        }
        if self.ip:
            st["podIP"] = self.ip
            st["podIPs"] = [{"ip": self.ip}]
        if self.init_containers:
            st["initContainerStatuses"] = [c.status() for c in self.init_containers]
        return st

    async def _report_now(self) -> None:
        st = self.build_status()
        if st == self.last_reported:
            return
        meta = self.pod["metadata"]
        try:
            await self.agent.api.request(
                "PATCH",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                {"status": st},
                content_type="application/merge-patch+json",
            )
            self.last_reported = st
        except ApiError as e:
            if e.status == 404:
                self.gone = True
                self.stop_event.set()
            else:
                log.warning("pod %s status update failed: %s", self.key, e)
        except (aiohttp.ClientError, OSError) as e:
            log.warning("pod %s status update failed: %s", self.key, e)

    async def _reporter(self) -> None:
        while True:
            await self.dirty.wait()
            self.dirty.clear()
            if self.gone:
                continue
            await self._report_now()
            # Coalesce bursts (a pod's containers all starting at once) into one update.
            await asyncio.sleep(0.05)


def _decoded(obj: dict[str, Any], kind: str) -> dict[str, bytes]:
    if kind == "secrets":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    out = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return out


class Agent:
    """The node: registration, heartbeat, pod watch, workers and the logs endpoint."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.node_name: str = args.node_name
        self.state_dir = Path(args.state_dir)
        self.api = Api(args.server, args.ca, args.cert, args.key)
        self.api_port = int(args.server.rsplit(":", 1)[1])
        self.ips = IPPool(args.pod_subnet)
        self.workers: dict[str, PodWorker] = {}
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.allocatable = {
            "cpu": str(os.cpu_count() or 1),
            "memory": f"{_mem_kib()}Ki",
            "pods": "110",
            "ephemeral-storage": f"{shutil.disk_usage(self.state_dir).total // 1024}Ki",
        }
        self.stopping = asyncio.Event()
        self.background: set[asyncio.Task[None]] = set()
        self._since = podspec.now_rfc3339()

    # -------------------------------------------------------------- config lookups for env
    def cache_get(self, ns: str, env_from: dict[str, Any]) -> dict[str, str]:
        if "configMapRef" in env_from:
            obj = self.objects.get((ns, "configmaps", env_from["configMapRef"]["name"]))
            return {k: v.decode() for k, v in _decoded(obj, "configmaps").items()} if obj else {}
        if "secretRef" in env_from:
            obj = self.objects.get((ns, "secrets", env_from["secretRef"]["name"]))
            return {k: v.decode() for k, v in _decoded(obj, "secrets").items()} if obj else {}
        return {}

    def key_ref(self, ns: str, vf: dict[str, Any]) -> str | None:
        kind, ref = (
            ("configmaps", vf["configMapKeyRef"]) if "configMapKeyRef" in vf else ("secrets", vf["secretKeyRef"])
        )
        obj = self.objects.get((ns, kind, ref["name"]))
        if not obj:
            return None
        v = _decoded(obj, kind).get(ref["key"])
        return v.decode() if v is not None else None

    async def _prefetch_env_objects(self, pod: dict[str, Any]) -> None:
        """Fetch the configMaps and secrets that env/envFrom refer to (container_env is synchronous)."""
        ns = pod["metadata"]["namespace"]
        refs: set[tuple[str, str]] = set()
        for c in pod["spec"].get("containers", []) + pod["spec"].get("initContainers", []):
            for ef in c.get("envFrom", []):
                if "configMapRef" in ef:
                    refs.add(("configmaps", ef["configMapRef"]["name"]))
                if "secretRef" in ef:
                    refs.add(("secrets", ef["secretRef"]["name"]))
            for e in c.get("env", []):
                vf = e.get("valueFrom", {})
                if "configMapKeyRef" in vf:
                    refs.add(("configmaps", vf["configMapKeyRef"]["name"]))
                if "secretKeyRef" in vf:
                    refs.add(("secrets", vf["secretKeyRef"]["name"]))
        for kind, name in refs:
            try:
                self.objects[(ns, kind, name)] = await self.api.request("GET", f"/api/v1/namespaces/{ns}/{kind}/{name}")
            except ApiError as e:
                # A missing object leaves the variable unset (optional refs); refusals are retried.
                if e.status != 404:
                    raise
                log.warning("pod %s/%s: %s %s: %s", ns, pod["metadata"]["name"], kind, name, e)

    # -------------------------------------------------------------- node
    def _node_status(self) -> dict[str, Any]:
        now = podspec.now_rfc3339()
        conds = [
            ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID"),
            ("Ready", "True", "KubeletReady"),
        ]
        return {
            "capacity": self.allocatable,
            "allocatable": self.allocatable,
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "reason": r,
                    "message": "localkube node agent",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": self._since,
                }
                for t, s, r in conds
            ],
            "addresses": [
                {"type": "InternalIP", "address": HOST_IP},
                {"type": "Hostname", "address": self.node_name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": int(self.args.kubelet_port)}},
            "nodeInfo": {
                "machineID": _machine_id(),
                "systemUUID": _machine_id(),
                "bootID": _boot_id(),
                "kernelVersion": os.uname().release,
                "osImage": "localkube processes",
                "containerRuntimeVersion": "localkube://0.1",
                "kubeletVersion": self.args.kubelet_version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    async def register(self) -> None:
        self._since = podspec.now_rfc3339()
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {
                    "kubernetes.io/hostname": self.node_name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "localkube.groupcluster.io/node": "true",
                },
            },
            "spec": {},
        }
        await self.api.request("POST", "/api/v1/nodes", node, ok=(200, 201, 409))
        await self._post_node_status()

    async def _post_node_status(self) -> None:
        await self.api.request(
            "PATCH",
            f"/api/v1/nodes/{self.node_name}/status",
            {"status": self._node_status()},
            content_type="application/merge-patch+json",
        )

    async def heartbeat(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node_name}"
        last_status = time.monotonic()
        while True:
            try:
                lease = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.node_name, "namespace": "kube-node-lease"},
                    "spec": {
                        "holderIdentity": self.node_name,
                        "leaseDurationSeconds": LEASE_SECONDS,
                        "renewTime": podspec.now_micro(),
                    },
                }
                try:
                    await self.api.request(
                        "PATCH", path, {"spec": lease["spec"]}, content_type="application/merge-patch+json"
                    )
                except ApiError as e:
                    if e.status != 404:
                        raise
                    await self.api.request(
                        "POST",
                        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                        lease,
                        ok=(200, 201, 409),
                    )
                if time.monotonic() - last_status > NODE_STATUS_EVERY:
                    await self._post_node_status()
                    last_status = time.monotonic()
            except (ApiError, aiohttp.ClientError, OSError) as e:
                log.warning("heartbeat failed: %s", e)
            await asyncio.sleep(LEASE_RENEW)

    # -------------------------------------------------------------- pods
    async def _handle(self, etype: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        w = self.workers.get(uid)
        if etype == "DELETED":
            if w:
                # Removed without the graceful path (force delete): stop at once.
                t = asyncio.create_task(w.stop_now(2.0))
                self.background.add(t)
                t.add_done_callback(self.background.discard)
            return
        if w:
            w.update(pod)
            return
        phase = pod.get("status", {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            if pod["metadata"].get("deletionTimestamp"):
                await PodWorker(self, pod)._finalize_delete()
            return
        if pod["metadata"].get("deletionTimestamp"):
            # Never started here and already going: nothing to stop, just let it go.
            await PodWorker(self, pod)._finalize_delete()
            return
        w = PodWorker(self, pod)
        self.workers[uid] = w
        w.task = asyncio.create_task(w.run())

    async def watch_pods(self) -> None:
        path = "/api/v1/pods"
        selector = {"fieldSelector": f"spec.nodeName={self.node_name}"}
        rv = ""
        while True:
            try:
                if not rv:
                    lst = await self.api.request("GET", path, params=selector)
                    rv = lst["metadata"]["resourceVersion"]
                    seen = set()
                    for pod in lst.get("items", []):
                        seen.add(pod["metadata"]["uid"])
                        await self._handle("ADDED", pod)
                    for uid, w in list(self.workers.items()):
                        if uid not in seen:
                            await self._handle("DELETED", w.pod)
                params = {
                    **selector,
                    "resourceVersion": rv,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": "300",
                }
                async for ev in self.api.watch(path, params):
                    et, obj = ev["type"], ev["object"]
                    if et == "ERROR":
                        # 410 Gone: our resourceVersion is too old; list again.
                        rv = ""
                        break
                    rv = obj["metadata"].get("resourceVersion", rv)
                    if et == "BOOKMARK":
                        continue
                    await self._handle(et, obj)
            except (TimeoutError, ApiError, aiohttp.ClientError, OSError, ValueError) as e:
                log.warning("pod watch interrupted: %s", e)
                rv = ""
                await asyncio.sleep(1)

    # -------------------------------------------------------------- logs endpoint (what kubectl logs reaches)
    async def _logs(self, request: web.Request) -> web.StreamResponse:
        ns, name, cname = (request.match_info[k] for k in ("ns", "pod", "container"))
        d = self.state_dir / "logs" / "pods"
        matches = sorted(d.glob(f"{ns}_{name}_*/{cname}.log"), key=lambda p: p.stat().st_mtime)
        if not matches:
            raise web.HTTPNotFound(text=f"no logs for {ns}/{name}/{cname}\n")
        path = matches[-1]
        tail = request.query.get("tailLines")
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        data = path.read_bytes()
        if tail is not None:
            data = b"".join(data.splitlines(keepends=True)[-int(tail) :]) if int(tail) > 0 else b""
        await resp.write(data)
        if request.query.get("follow") in ("true", "1"):
            pos = path.stat().st_size
            while not self.stopping.is_set():
                await asyncio.sleep(0.5)
                with open(path, "rb") as f:  # noqa: ASYNC230  a local log file the agent writes: reads do not block
                    f.seek(pos)
                    chunk = f.read()
                if chunk:
                    pos += len(chunk)
                    await resp.write(chunk)
        return resp

    async def serve_kubelet_api(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/containerLogs/{ns}/{pod}/{container}", self._logs)
        app.router.add_get("/healthz", _healthz)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.args.ca)
        ctx.load_cert_chain(self.args.serving_cert, self.args.serving_key)
        # Only holders of a certificate from the cluster CA (the apiserver) may read logs.
        ctx.verify_mode = ssl.CERT_REQUIRED
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, HOST_IP, int(self.args.kubelet_port), ssl_context=ctx).start()
        return runner

    # -------------------------------------------------------------- main
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        async with self.api:
            await self.register()
            runner = await self.serve_kubelet_api()
            tasks = [asyncio.create_task(self.heartbeat()), asyncio.create_task(self.watch_pods())]
            log.info("node %s registered; kubelet endpoint 127.0.0.1:%s", self.node_name, self.args.kubelet_port)
            await self.stopping.wait()
            for t in tasks:
                t.cancel()
            log.info("stopping %d pods", len(self.workers))
            await asyncio.gather(
                *(w.stop_now(min(w.grace(), 10.0)) for w in list(self.workers.values())),
                return_exceptions=True,
            )
            await asyncio.gather(*(w.task for w in list(self.workers.values()) if w.task), return_exceptions=True)
            await runner.cleanup()


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def _mem_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    return 1024 * 1024


def _machine_id() -> str:
    for p in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        with contextlib.suppress(OSError):
            return Path(p).read_text().strip()
    return "localkube"


def _boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return "localkube"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="localkube node agent")
    p.add_argument("--state-dir", required=True)
    p.add_argument("--server", required=True)
    p.add_argument("--node-name", required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--serving-cert", required=True)
    p.add_argument("--serving-key", required=True)
    p.add_argument("--kubelet-port", required=True, type=int)
    p.add_argument("--kubelet-version", default="v0.0.0")
    p.add_argument(
        "--pod-subnet",
        default=os.environ.get("LOCAL_KUBE_POD_SUBNET", "127.0.0"),
        help="first three octets of pod addresses (default 127.0.0, or $LOCAL_KUBE_POD_SUBNET)",
    )
    args = p.parse_args(argv)
    if not args.pod_subnet.startswith("127."):
        p.error("--pod-subnet must be inside 127.0.0.0/8")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    asyncio.run(Agent(args).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
