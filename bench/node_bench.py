#!/usr/bin/env python3
"""What a DataVolume costs on a real node beyond its import (issue 36, part 1).

Starts a one-node cluster (../shared/kube/cluster.sh, its own DIR), installs Quarry from a release
build as the README's "Install on a cluster" does, then, in ONE run, times:

  local      `quarry import URL OUT --json` on the node, OUT on the pool's filesystem
             (/var/hpvolumes): the import alone, the baseline
  http       a DataVolume importing the same URL (qcow2.xz over HTTP), immediate binding
  upload     a DataVolume with an upload source, the image POSTed through the upload proxy as
             virtctl does (token from the token API)
  csi-clone  a DataVolume cloning the http one in its namespace (CSI clone, no pod)
  copy       a DataVolume cloning it from another namespace (host-assisted: upload server and
             clone source pod)

For every DataVolume the harness watches (kubectl --watch, stamped on receipt with a monotonic
clock) the DataVolume's phase, every PVC and every pod of its namespace, and splits the time from
`kubectl create` to Succeeded into:

  to-pvc     create -> the first PVC of the namespace made by the controller (the DataVolume's
             PVC, or PVC' of a populator)
  provision  -> that PVC (PVC' when there is one) Bound (CSI provisioning)
  pod-start  -> the pod doing the work Running (scheduling, volume mount, container start)
  work       -> that pod's container terminated (the import itself, as the pod ran it)
  finish     -> the DataVolume Succeeded (rebind, binding, status)
  overhead   total - local (the issue's goal: at most 2 s)

With --parallel 8,16,32 (issue 36, part 2) it instead creates that many DataVolumes at once
(HTTP; qcow2, qcow2.xz, raw.gz and raw.zst of the same disk in turn) and, with --uploads N, N
upload DataVolumes fed at once through the proxy, and reports the wall time to the last
Succeeded, the aggregate rate of written (non-zero) bytes against the device's O_DIRECT floor
for the same bytes (`dd oflag=direct` on the pool's filesystem), the slowest DataVolume against
the median, the same images imported one after another by `quarry import` on the node (what
the CPU and device allow for the same work), and each importer pod's peak memory (its memory
cgroup, sampled every 0.25 s: RSS, and usage with page cache, which the pod's limit also
counts).

Figures go in bench/results/, never in tests.  Run as root on a machine with the cluster's
artefacts (~/.cache/kubelab); `--keep` leaves the cluster up, `--reuse` attaches to one left up.

  bench/node_bench.py [--size-mib 512] [--runs 3] [--dir /var/tmp/quarry-bench] [--reuse] [--keep]
  bench/node_bench.py --parallel 8,16,32 --uploads 8 [--size-mib 256] ...
"""

import argparse
import json
import os
import queue
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NS = "quarry"  # testkit::cluster::NAMESPACE
CLASS = "hostpath-csi-local"
POOL = Path("/var/hpvolumes")


def sh(*args, check=True, capture=True, env=None, input=None):
    r = subprocess.run(args, check=False, text=True, env=env, input=input,
                       stdout=subprocess.PIPE if capture else None,
                       stderr=subprocess.PIPE if capture else None)
    if check and r.returncode != 0:
        sys.exit(f"node_bench: {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}")
    return r.stdout if capture else ""


class Cluster:
    def __init__(self, cluster_sh, dir):
        self.sh, self.dir = cluster_sh, dir
        out = sh("bash", cluster_sh, "env", dir)
        vars = dict(w.split("=", 1) for w in out.split() if "=" in w)
        self.env = dict(os.environ)
        self.env["KUBECONFIG"] = vars["KUBECONFIG"]
        self.env["PATH"] = vars["PATH"].replace("$PATH", os.environ["PATH"])
        self.node_ip = vars["KUBELAB_NODE_IP"]

    def kubectl(self, *args, input=None, check=True):
        return sh("kubectl", *args, env=self.env, input=input, check=check)

    def apply(self, yaml):
        self.kubectl("apply", "-f", "-", input=yaml)

    def wait_for(self, args, ok, seconds, interval, what):
        """Runs kubectl `args` until `ok` holds of its output; exits naming `what` after `seconds`."""
        deadline = time.monotonic() + seconds
        while not ok(self.kubectl(*args, check=False)):
            if time.monotonic() > deadline:
                sys.exit(f"node_bench: {what}")
            time.sleep(interval)

    def jsonpath(self, ns, obj, path):
        return self.kubectl("-n", ns, "get", obj, "-o", f"jsonpath={path}", check=False)


def install(c, quarry):
    out = Path(c.dir) / "image"
    sh("bash", str(ROOT / "scripts/build-image.sh"), "--binary", quarry, "--tag", "latest",
       "--out", str(out))
    sh("bash", c.sh, "load", c.dir, str(out / "quarry-oci.tar"), "quay.io/quarry/quarry:latest")
    c.kubectl("apply", "--server-side", "-k", str(ROOT / "deploy"))
    # On a cluster left up, the same tag now names a new image: start the pods again.
    c.kubectl("-n", NS, "rollout", "restart", "deployment")
    c.kubectl("-n", NS, "rollout", "restart", "daemonset", check=False)
    for d in c.kubectl("-n", NS, "get", "deployment", "-o", "name").split():
        c.kubectl("-n", NS, "rollout", "status", d, "--timeout=300s")
    c.wait_for(["-n", NS, "get", "daemonset", "quarry-csi"], bool, 120, 1,
               "no CSI DaemonSet in 120 s")
    c.kubectl("-n", NS, "rollout", "status", "daemonset/quarry-csi", "--timeout=300s")


def pod_cpu_limit(c, cpu):
    """Applies a CDI CR that sets the CPU limit of importer, upload and clone source pods (the
    memory limit stays CDI's 600M), and waits until the CDIConfig's status shows it in force."""
    c.apply(f"""
apiVersion: cdi.kubevirt.io/v1beta1
kind: CDI
metadata: {{name: cdi}}
spec:
  config:
    podResourceRequirements:
      requests: {{cpu: 100m, memory: 60M}}
      limits: {{cpu: "{cpu}", memory: 600M}}
""")
    path = "jsonpath={.status.defaultPodResourceRequirements.limits.cpu}"
    c.wait_for(["get", "cdiconfig", "config", "-o", path], lambda out: out == cpu, 60, 0.5,
               f"the CDIConfig shows no CPU limit {cpu} after 60 s")


def make_image(dir, size_mib):
    """A raw disk of half seeded random data, half holes, as qcow2.xz; returns (path, raw size)."""
    raw = dir / "disk.raw"
    rng = random.Random(36)
    with open(raw, "wb") as f:
        f.truncate(size_mib << 20)
        for mib in range(0, size_mib, 2):
            f.seek(mib << 20)
            f.write(rng.randbytes(1 << 20))
    qcow2 = dir / "disk.qcow2"
    sh("qemu-img", "convert", "-O", "qcow2", str(raw), str(qcow2))
    sh("xz", "-T0", "-1", "-k", str(qcow2))
    return dir / "disk.qcow2.xz", size_mib << 20


def mixed_images(dir):
    """The formats --parallel rotates through, made from disk.raw (make_image first)."""
    raw = dir / "disk.raw"
    sh("sh", "-c", f"gzip -1 -c {raw} > {raw}.gz")
    sh("zstd", "-q", "-1", "-T0", "-k", str(raw))
    return ["disk.qcow2", "disk.qcow2.xz", "disk.raw.gz", "disk.raw.zst"]


class MemorySampler:
    """Peak memory of every pod on the node, from its memory cgroup (v1, cgroupfs driver):
    the largest RSS seen (memory.stat total_rss, sampled) and max_usage_in_bytes (page cache
    included, as the limit counts it), by pod UID."""

    ROOT = Path("/sys/fs/cgroup/memory/kubepods")
    CPU = Path("/sys/fs/cgroup/cpuacct/kubepods")
    THROTTLE = Path("/sys/fs/cgroup/cpu/kubepods")

    def __init__(self):
        self.rss, self.usage = {}, {}
        # CPU seconds used and throttled, by pod UID: at the first and the last sighting.
        self.cpu_first, self.cpu_last = {}, {}
        self.stop_flag = False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def pods(self):
        for d in list(self.ROOT.glob("pod*")) + list(self.ROOT.glob("*/pod*")):
            yield d.name[3:], d

    def run(self):
        while not self.stop_flag:
            for uid, d in self.pods():
                try:
                    stat = dict(l.split() for l in (d / "memory.stat").read_text().splitlines())
                    rss = int(stat.get("total_rss", 0))
                    usage = int((d / "memory.max_usage_in_bytes").read_text())
                except (OSError, ValueError):
                    continue
                self.rss[uid] = max(self.rss.get(uid, 0), rss)
                self.usage[uid] = max(self.usage.get(uid, 0), usage)
            for uid, cpu in self.cpu():
                self.cpu_first.setdefault(uid, cpu)
                self.cpu_last[uid] = cpu
            time.sleep(0.25)

    def cpu(self):
        """(uid, (CPU seconds, throttled seconds)) of every pod, cumulative."""
        for d in list(self.CPU.glob("pod*")) + list(self.CPU.glob("*/pod*")):
            try:
                used = int((d / "cpuacct.usage").read_text()) / 1e9
                stat = (self.THROTTLE / d.relative_to(self.CPU) / "cpu.stat").read_text()
                throttled = int(dict(l.split() for l in stat.splitlines())["throttled_time"]) / 1e9
            except (OSError, ValueError, KeyError):
                continue
            yield d.name[3:], (used, throttled)

    def spent(self, uid):
        """CPU and throttled seconds of `uid` while sampled."""
        first, last = self.cpu_first.get(uid), self.cpu_last.get(uid)
        if first is None:
            return (0.0, 0.0)
        return (last[0] - first[0], last[1] - first[1])

    def stop(self):
        self.stop_flag = True
        self.t.join()


class NodeCpu:
    """Where the node's CPU went over a run: busy and idle seconds from /proc/stat, and the CPU
    of every host process (outside the pods' cgroups, which MemorySampler reads) that ran
    during it, by command name. What busy time no pod and no live process accounts for was
    spent by processes that came and went (runc, CNI plugins, mount helpers)."""

    HZ = os.sysconf("SC_CLK_TCK")

    def __init__(self):
        self.start_stat, self.start_procs = self.stat(), self.procs()

    @staticmethod
    def stat():
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        idle = f[3] + f[4]  # idle, iowait
        return sum(f[:8]) - idle, idle

    @classmethod
    def procs(cls):
        """(pid, start time) -> (command, CPU seconds) of every host process."""
        out = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                if "kubepods" in (d / "cgroup").read_text():
                    continue
                raw = (d / "stat").read_text()
            except OSError:
                continue
            comm = raw[raw.index("(") + 1:raw.rindex(")")]
            f = raw[raw.rindex(")") + 2:].split()
            out[(d.name, f[19])] = (comm, (int(f[11]) + int(f[12])) / cls.HZ)
        return out

    def stop(self, pods_cpu):
        """{name: CPU seconds}: busy, idle, pods (given), each host command, and the rest."""
        busy0, idle0 = self.start_stat
        busy1, idle1 = self.stat()
        by_comm = {}
        for key, (comm, cpu) in self.procs().items():
            before = self.start_procs.get(key, (comm, 0.0))[1]
            comm = "containerd-shim" if comm.startswith("containerd-shi") else comm
            by_comm[comm] = by_comm.get(comm, 0.0) + cpu - before
        busy, idle = (busy1 - busy0) / self.HZ, (idle1 - idle0) / self.HZ
        host = {k: round(v, 2) for k, v in sorted(by_comm.items(), key=lambda kv: -kv[1])
                if v >= 0.05}
        rest = busy - sum(pods_cpu.values()) - sum(by_comm.values())
        return {"busy": round(busy, 2), "idle": round(idle, 2),
                "pods": {k: round(v, 2) for k, v in pods_cpu.items()}, "host": host,
                "exited processes": round(rest, 2)}


def api_requests(c):
    """The API server's request counters: {(verb, resource): n} and {flow schema: n}, the
    latter telling who asked (the kubelet is system-nodes, Quarry's pods and the CSI sidecars
    service-accounts, kube-controller-manager and kube-scheduler their own)."""
    by_resource, by_flow = {}, {}
    for line in c.kubectl("get", "--raw", "/metrics", check=False).splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.rindex("}")]
                          .replace('"', "").split(","))
            key = (labels.get("verb", ""), labels.get("resource", "") +
                   ("/" + labels["subresource"] if labels.get("subresource") else ""))
            by_resource[key] = by_resource.get(key, 0) + float(line.split()[-1])
        elif line.startswith("apiserver_flowcontrol_dispatched_requests_total{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.rindex("}")]
                          .replace('"', "").split(","))
            flow = labels.get("flow_schema", "")
            by_flow[flow] = by_flow.get(flow, 0) + float(line.split()[-1])
    return by_resource, by_flow


def requests_between(before, after):
    """What `api_requests` counted between two readings: (by resource, by flow schema)."""
    return tuple({k: int(v - b.get(k, 0)) for k, v in sorted(a.items(), key=lambda kv: kv[0])
                  if v - b.get(k, 0) >= 1} for b, a in zip(before, after))


class Watch:
    """`kubectl get KIND -n NS --watch` lines, stamped on receipt."""

    def __init__(self, c, ns, kind, template, events):
        self.p = subprocess.Popen(
            ["kubectl", "-n", ns, "get", kind, "--watch", "-o", f"jsonpath={template}"],
            env=c.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.t = threading.Thread(target=self.read, args=(kind, events), daemon=True)
        self.t.start()

    def read(self, kind, events):
        for line in self.p.stdout:
            events.put((time.monotonic(), kind, line.rstrip("\n").split("|")))

    def stop(self):
        self.p.kill()
        self.p.wait()


DV_T = "{.metadata.name}|{.status.phase}{\"\\n\"}"
PVC_T = ("{.metadata.name}|{.status.phase}|{.metadata.annotations.cdi\\.kubevirt\\.io/"
         "storage\\.populator\\.kind}{\"\\n\"}")
POD_T = ("{.metadata.name}|{.status.phase}|{.spec.nodeName}|"
         "{.status.containerStatuses[0].state.running.startedAt}|"
         "{.status.containerStatuses[0].state.terminated.reason}{\"\\n\"}")


def timeline(c, ns, dv, create, pod_filter=lambda name: True, extra_ns=None, marks=None):
    """Creates the DataVolume (`create()` does) and returns its milestones in seconds; `marks`,
    (monotonic time, name) pairs a client thread appends, are added as milestones too."""
    events = queue.Queue()
    watches = [Watch(c, n, k, t, events) for n in [ns] + ([extra_ns] if extra_ns else [])
               for k, t in (("dv", DV_T), ("pvc", PVC_T), ("pods", POD_T))]
    time.sleep(1.0)  # let the watches list (nothing there yet)
    t0 = time.monotonic()
    create()
    m = {}
    deadline = t0 + 600
    # Objects listed before the creation are earlier rows': never this one's milestones.
    earlier = set()
    while "succeeded" not in m:
        try:
            at, kind, f = events.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            sys.exit(f"node_bench: {ns}/{dv} not Succeeded in 600 s: {m}")
        if at < t0 or (kind, f[0]) in earlier:
            earlier.add((kind, f[0]))
            continue
        t = at - t0
        if kind == "dv" and f[0] == dv and len(f) > 1:
            m.setdefault(f"dv:{f[1]}", t)
            if f[1] == "Succeeded":
                m["succeeded"] = t
            if f[1] == "Failed":
                sys.exit(f"node_bench: {ns}/{dv} Failed")
        elif kind == "pvc":
            m.setdefault("pvc", t)
            # PVC' when there is one, else the DataVolume's own PVC.
            prime = len(f) > 2 and f[2] != ""
            key = "prime" if prime else "own"
            m.setdefault(f"{key}-made", t)
            if f[1] == "Bound":
                m.setdefault(f"{key}-bound", t)
        elif kind == "pods" and not pod_filter(f[0]):
            if len(f) > 3 and f[3]:
                m.setdefault("other-pod-running", t)
        elif kind == "pods":
            m.setdefault("pod-made", t)
            if len(f) > 2 and f[2]:
                m.setdefault("pod-scheduled", t)
            if len(f) > 3 and f[3]:
                m.setdefault("pod-running", t)
            if len(f) > 4 and f[4]:
                m.setdefault("pod-done", t)
    for w in watches:
        w.stop()
    for at, name in marks or []:
        m[name] = at - t0
    return m


def parts(m, local):
    made = m.get("pvc")
    bound = m.get("prime-bound", m.get("own-bound"))
    total = m["succeeded"]
    row = {"total": total, "overhead": total - local if local is not None else None}
    row["to-pvc"] = made
    # Where an upload's client waited (the token, the ready annotation, the POST itself), and
    # a host-assisted copy's upload server started before its source pod was made.
    if "post-end" in m and "pod-running" in m:
        row["to-ready"] = m["ready-seen"] - m["pod-running"]
        row["post"] = m["post-end"] - m["post-start"]
    if "other-pod-running" in m and "pod-made" in m:
        row["server-to-source"] = m["pod-made"] - m["other-pod-running"]
    row["provision"] = bound - made if bound is not None and made is not None else None
    if "pod-running" in m:
        row["pod-start"] = m["pod-running"] - max(m.get("pod-made", 0), bound or 0)
        row["work"] = m.get("pod-done", total) - m["pod-running"]
        row["finish"] = total - m.get("pod-done", total)
    else:
        row["finish"] = total - (bound or total)
    return row


def dv_yaml(ns, name, source, size):
    return f"""apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: {name}
  namespace: {ns}
  annotations: {{cdi.kubevirt.io/storage.bind.immediate.requested: "true"}}
spec:
  source: {source}
  storage:
    storageClassName: {CLASS}
    resources: {{requests: {{storage: {size}}}}}
"""


def http_server(dir, ip):
    s = socket.socket()
    s.bind((ip, 0))
    port = s.getsockname()[1]
    s.close()
    conf = dir / "nginx.conf"
    conf.write_text(f"""daemon off; worker_processes 2; pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log; events {{ worker_connections 64; }}
http {{ access_log off; sendfile on; server {{ listen {ip}:{port}; root {dir}; }} }}
""")
    p = subprocess.Popen(["nginx", "-c", str(conf), "-p", str(dir)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection((ip, port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                sys.exit("node_bench: nginx did not start")
            time.sleep(0.05)
    return p, f"http://{ip}:{port}"


def stop(server):
    """Stops nginx: SIGTERM, which its master passes to its workers (SIGKILL left them running,
    holding the port and the files)."""
    server.terminate()
    server.wait()


def local_import(quarry, url):
    out = POOL / "node-bench-local.img"
    out.unlink(missing_ok=True)
    sh("sync")
    t = time.monotonic()
    sh(quarry, "import", url, str(out), "--json")
    took = time.monotonic() - t
    out.unlink()
    return took


def upload(c, ns, name, image, marks=None):
    """What `virtctl image-upload` does: a token, then once the PVC says its upload server is
    ready, one POST through the upload proxy. Appends its milestones to `marks`."""
    marks = marks if marks is not None else []
    c.wait_for(["-n", ns, "get", f"pvc/{name}", "-o", "name"], bool, 60, 0.1,
               f"no PVC {ns}/{name}")
    token = c.kubectl("create", "-f", "-", "-o", "jsonpath={.status.token}", input=f"""
apiVersion: upload.cdi.kubevirt.io/v1beta1
kind: UploadTokenRequest
metadata: {{name: {name}, namespace: {ns}}}
spec: {{pvcName: {name}}}
""")
    ip = c.jsonpath(NS, "service/quarry-uploadproxy", "{.spec.clusterIP}")
    c.kubectl("-n", ns, "wait", f"pvc/{name}", "--timeout=300s",
              "--for=jsonpath={.metadata.annotations.cdi\\.kubevirt\\.io/storage\\.pod\\.ready}=true")
    marks.append((time.monotonic(), "ready-seen"))
    marks.append((time.monotonic(), "post-start"))
    # `-T` streams the file as virtctl does (`--data-binary @FILE` reads it all into memory
    # first, a copy of every byte on the node's two cores).
    code = sh("curl", "-sS", "-k", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
              "-H", f"Authorization: Bearer {token}", "-H",
              "Content-Type: application/octet-stream", "-H", "Expect:", "-T", str(image),
              f"https://{ip}/v1beta1/upload", check=False)
    marks.append((time.monotonic(), "post-end"))
    if code != "200":
        sys.exit(f"node_bench: the upload answered {code}")


def many(c, quarry, n, uploads, files, base, work, size, data_bytes):
    """n HTTP DataVolumes (and `uploads` upload ones) at once; returns a result row."""
    ns = c.kubectl("create", "namespace", f"bench-many-{n}-{os.getpid()}",
                   "-o", "jsonpath={.metadata.name}")
    names = [f"dv-{i}" for i in range(n)] + [f"up-{i}" for i in range(uploads)]
    docs = [dv_yaml(ns, f"dv-{i}", f"{{http: {{url: '{base}/{files[i % len(files)]}'}}}}", size)
            for i in range(n)]
    docs += [dv_yaml(ns, f"up-{i}", "{upload: {}}", size) for i in range(uploads)]
    events = queue.Queue()
    watches = [Watch(c, ns, "dv", DV_T, events),
               Watch(c, ns, "pods", "{.metadata.name}|{.metadata.uid}{\"\\n\"}", events)]
    sampler = MemorySampler()
    # The pods already running (Quarry's controllers, the CSI driver, the snapshot-controller).
    resident = dict(line.split(" ", 1) for line in c.kubectl(
        "get", "pods", "-A", "-o",
        "jsonpath={range .items[*]}{.metadata.uid} {.metadata.namespace}/{.metadata.name}{\"\\n\"}{end}",
        check=False).splitlines() if " " in line)
    time.sleep(1.0)
    requests_before = api_requests(c)
    node_cpu = NodeCpu()
    t0 = time.monotonic()
    c.apply("---\n".join(docs))
    for i in range(uploads):
        threading.Thread(target=upload, args=(c, ns, f"up-{i}", work / "disk.qcow2"),
                         daemon=True).start()
    done, pod_uid, phases = {}, {}, {}
    deadline = t0 + 1800
    while len(done) < len(names):
        try:
            at, kind, f = events.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            sys.exit(f"node_bench: {len(done)}/{len(names)} Succeeded in 1800 s")
        if kind == "pods" and len(f) > 1:
            pod_uid[f[1]] = f[0]
        elif kind == "dv" and len(f) > 1 and f[1]:
            phases.setdefault(f[0], {}).setdefault(f[1], at - t0)
            if f[1] == "Succeeded":
                done.setdefault(f[0], at - t0)
        elif kind == "dv" and len(f) > 1 and f[1] == "Failed":
            sys.exit(f"node_bench: {ns}/{f[0]} Failed")
    wall = max(done.values())
    sampler.stop()
    for w in watches:
        w.stop()
    pods = {name: uid for uid, name in pod_uid.items()}
    # CPU seconds (and seconds throttled by the pods' CPU limits) by role over the run,
    # and the node's (before the floor and the local imports below run).
    def role_cpu(prefix):
        spent = [sampler.spent(uid) for name, uid in pods.items() if name.startswith(prefix)]
        return [round(sum(x[0] for x in spent), 2), round(sum(x[1] for x in spent), 2)]
    def resident_cpu(match):
        spent = [sampler.spent(uid) for uid, name in resident.items() if match(name)]
        return [round(sum(x[0] for x in spent), 2), round(sum(x[1] for x in spent), 2)]
    cpu = {"importers": role_cpu("importer-"), "upload servers": role_cpu("cdi-upload-"),
           "upload proxy": resident_cpu(lambda n: n.startswith(f"{NS}/quarry-uploadproxy-")),
           "CSI driver and sidecars": resident_cpu(lambda n: n.startswith(f"{NS}/quarry-csi-")),
           "Quarry's controllers": resident_cpu(
               lambda n: n.startswith(f"{NS}/") and not n.startswith(
                   (f"{NS}/quarry-uploadproxy-", f"{NS}/quarry-csi-"))),
           "other pods": resident_cpu(lambda n: not n.startswith(f"{NS}/"))}
    node = node_cpu.stop({k: v[0] for k, v in cpu.items()})
    by_resource, by_flow = requests_between(requests_before, api_requests(c))
    # The device's floor for the same bytes: one O_DIRECT stream on the pool's filesystem.
    floor_file = POOL / "node-bench-floor"
    mib = (data_bytes * len(names)) >> 20
    sh("sync")
    t = time.monotonic()
    sh("dd", "if=/dev/zero", f"of={floor_file}", "bs=1M", f"count={mib}", "oflag=direct",
       "conv=fsync", "status=none")
    floor = time.monotonic() - t
    floor_file.unlink()
    # What the node can do for the same work: each image imported by `quarry import` on the
    # node, one after another with both cores (sums of the local imports of the files used).
    local = {f: local_import(quarry, f"{base}/{f}") for f in set(files[: max(n, 1)])}
    serial = sum(local[files[i % len(files)]] for i in range(n))
    imports = sorted(v for k, v in done.items() if k.startswith("dv-"))
    mem = [(sampler.rss.get(uid, 0), sampler.usage.get(uid, 0))
           for name, uid in pods.items() if name.startswith(("importer-", "cdi-upload-"))]
    c.kubectl("delete", "namespace", ns, "--wait=false")
    return {
        "cpu_seconds_and_throttled": cpu,
        "node_cpu": node,
        "api_requests": {"by_flow_schema": by_flow,
                         "by_verb_and_resource": {f"{v} {r}": n for (v, r), n in by_resource.items()}},
        "dvs": n, "uploads": uploads, "wall": wall, "floor": floor, "serial_local": serial,
        "rate": data_bytes * len(names) / wall / 2**20,
        "median": statistics.median(imports) if imports else None,
        "slowest": imports[-1] if imports else None,
        "uploads_wall": max((v for k, v in done.items() if k.startswith("up-")), default=None),
        "peak_rss_mib": max((m[0] for m in mem), default=0) / 2**20,
        "peak_usage_mib": max((m[1] for m in mem), default=0) / 2**20,
        "pods_sampled": len(mem),
        # Each DataVolume's image and when it first showed each phase (its pod running:
        # ImportInProgress or UploadReady), to tell a late start from slow work.
        "per_dv": {name: {"file": files[int(name[3:]) % len(files)] if name.startswith("dv-")
                          else "upload", **phases.get(name, {})} for name in names},
    }


def fmt(v):
    return "" if v is None else f"{v:.2f}"


def report_many(args, results):
    print(f"\nMany at once, {args.size_mib} MiB disks (half data), seconds; rate in MiB/s of "
          "written data\n")
    print("| DVs | uploads | wall | floor | wall/floor | local imports in a row | rate | "
          "median DV | slowest DV | slowest/median | uploads wall | peak RSS MiB | "
          "peak usage MiB |")
    print("|" + "---:|" * 13)
    for r in results:
        ratio = r["wall"] / r["floor"] if r["floor"] else None
        starve = r["slowest"] / r["median"] if r["median"] else None
        print(f"| {r['dvs']} | {r['uploads']} | {fmt(r['wall'])} | {fmt(r['floor'])} | "
              f"{fmt(ratio)} | {fmt(r['serial_local'])} | {r['rate']:.0f} | "
              f"{fmt(r['median'])} | {fmt(r['slowest'])} | "
              f"{fmt(starve)} | {fmt(r['uploads_wall'])} | {r['peak_rss_mib']:.0f} | "
              f"{r['peak_usage_mib']:.0f} |")
    for r in results:
        print(f"\n{r['dvs']} DVs, {r['uploads']} uploads: CPU seconds (throttled seconds) by "
              "role: " + ", ".join(f"{k} {v[0]:.1f} ({v[1]:.1f})"
                                   for k, v in r["cpu_seconds_and_throttled"].items()))
        n = r["node_cpu"]
        print(f"\n{r['dvs']} DVs, {r['uploads']} uploads: the node's CPU seconds over the run: "
              f"busy {n['busy']:.1f}, idle {n['idle']:.1f}; in pods (above) "
              f"{sum(n['pods'].values()):.1f}; host processes: "
              + ", ".join(f"{k} {v:.1f}" for k, v in n["host"].items())
              + f"; processes that came and went {n['exited processes']:.1f}")
        a = r["api_requests"]
        writes = sum(n for k, n in a["by_verb_and_resource"].items()
                     if k.split()[0] in ("CREATE", "POST", "PATCH", "APPLY", "UPDATE", "PUT", "DELETE"))
        per = max(r["dvs"] + r["uploads"], 1)
        print(f"\n{r['dvs']} DVs, {r['uploads']} uploads: API requests "
              f"{sum(a['by_flow_schema'].values())} ({writes} writes, {writes / per:.1f} per "
              "DataVolume); by flow schema: "
              + ", ".join(f"{k} {v}" for k, v in sorted(a["by_flow_schema"].items(),
                                                        key=lambda kv: -kv[1]))
              + "; writes by resource: " + ", ".join(
                  f"{k} {v}" for k, v in sorted(a["by_verb_and_resource"].items(),
                                                key=lambda kv: -kv[1])
                  if k.split()[0] in ("CREATE", "POST", "PATCH", "APPLY", "UPDATE", "PUT", "DELETE")))
        if not r["dvs"]:
            continue
        # Who was slowest, and whether it started late or worked slowly, by image.
        by_file = {}
        for name, d in r["per_dv"].items():
            if name.startswith("dv-") and "Succeeded" in d:
                start = d.get("ImportInProgress")
                by_file.setdefault(d["file"], []).append(
                    (d["Succeeded"], start, d["Succeeded"] - start if start is not None else None))
        print(f"\n{r['dvs']} DVs, {r['uploads']} uploads: per image, median seconds to "
              "ImportInProgress, from it to Succeeded, and the slowest total")
        for f, v in sorted(by_file.items()):
            starts = [x[1] for x in v if x[1] is not None]
            works = [x[2] for x in v if x[2] is not None]
            print(f"  {f}: n={len(v)} start {fmt(statistics.median(starts) if starts else None)}"
                  f" work {fmt(statistics.median(works) if works else None)}"
                  f" slowest {fmt(max(x[0] for x in v))}")
    print("\nraw:", json.dumps(results))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp/quarry-bench")
    ap.add_argument("--cluster-sh", default=str(ROOT.parent / "shared/kube/cluster.sh"))
    ap.add_argument("--quarry", default=str(ROOT / "target/release/quarry"))
    ap.add_argument("--reuse", action="store_true", help="attach to a cluster left up by --keep")
    ap.add_argument("--reinstall", action="store_true", help="with --reuse: install again")
    ap.add_argument("--keep", action="store_true", help="leave the cluster up")
    ap.add_argument("--only", default="local,http,upload,csi-clone,copy")
    ap.add_argument("--parallel", default="", help="e.g. 8,16,32: that many DataVolumes at once")
    ap.add_argument("--uploads", type=int, default=0, help="with --parallel: uploads at once")
    ap.add_argument("--cpu-limit", default="",
                    help="e.g. 2: a CDI CR whose podResourceRequirements limit Quarry's pods to "
                         "that CPU (CDI's default, without one, is 750m)")
    args = ap.parse_args()
    if not args.reuse:
        sh("cargo", "build", "--release", "--locked", "--bin", "quarry", capture=False)
        sh("bash", args.cluster_sh, "up", args.dir, capture=False)
    c = Cluster(args.cluster_sh, args.dir)
    if not args.reuse or args.reinstall:
        install(c, args.quarry)
    if args.cpu_limit:
        pod_cpu_limit(c, args.cpu_limit)
    work = Path(tempfile.mkdtemp(prefix="node-bench-", dir="/var/tmp"))
    work.chmod(0o755)  # nginx's workers read it
    only = args.only.split(",")
    rows = []
    try:
        image, raw_len = make_image(work, args.size_mib)
        server, base = http_server(work, c.node_ip)
        url = f"{base}/{image.name}"
        size = f"{(raw_len >> 20) + 64}Mi"
        if args.parallel:
            files = mixed_images(work)
            data = raw_len // 2  # make_image writes every other MiB
            results = [many(c, args.quarry, int(n), args.uploads if i == 0 else 0, files, base,
                            work, size, data)
                       for i, n in enumerate(args.parallel.split(","))]
            if args.uploads:
                results.append(many(c, args.quarry, 0, args.uploads, files, base, work, size,
                                    data))
            stop(server)
            report_many(args, results)
            return
        for run in range(args.runs):
            local = local_import(args.quarry, url)
            if "local" in only:
                rows.append(("local", run, {"total": local, "work": local}))
            ns = c.kubectl("create", "namespace", f"bench-{run}-{os.getpid()}",
                           "-o", "jsonpath={.metadata.name}")
            if "http" in only:
                m = timeline(c, ns, "http", lambda: c.apply(
                    dv_yaml(ns, "http", f"{{http: {{url: '{url}'}}}}", size)))
                rows.append(("http", run, parts(m, local)))
            if "upload" in only:
                marks = []

                def create_upload():
                    c.apply(dv_yaml(ns, "up", "{upload: {}}", size))
                    threading.Thread(target=upload, args=(c, ns, "up", image, marks),
                                     daemon=True).start()
                m = timeline(c, ns, "up", create_upload, marks=marks)
                rows.append(("upload", run, parts(m, local)))
            if "csi-clone" in only and "http" in only:
                m = timeline(c, ns, "csi", lambda: c.apply(
                    dv_yaml(ns, "csi", f"{{pvc: {{namespace: {ns}, name: http}}}}", size)))
                rows.append(("csi-clone", run, parts(m, local)))
            if "copy" in only and "http" in only:
                other = c.kubectl("create", "namespace", f"bench-copy-{run}-{os.getpid()}",
                                  "-o", "jsonpath={.metadata.name}")
                m = timeline(c, other, "copy", lambda: c.apply(
                    dv_yaml(other, "copy", f"{{pvc: {{namespace: {ns}, name: http}}}}", size)),
                    pod_filter=lambda n: n.endswith("-source-pod"), extra_ns=ns)
                rows.append(("copy", run, parts(m, local)))
                c.kubectl("delete", "namespace", other, "--wait=false")
            c.kubectl("delete", "namespace", ns, "--wait=false")
        stop(server)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.keep and not args.reuse:
            sh("bash", args.cluster_sh, "down", args.dir, check=False)
    cols = ["total", "overhead", "to-pvc", "provision", "pod-start", "work", "finish",
            "to-ready", "post", "server-to-source"]
    print(f"\nDataVolume timelines, {args.size_mib} MiB disk (qcow2.xz), seconds; median of "
          f"{args.runs} runs\n")
    print("| row | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name in dict.fromkeys(r[0] for r in rows):
        mine = [r[2] for r in rows if r[0] == name]
        med = {k: statistics.median([x[k] for x in mine if x.get(k) is not None])
               if any(x.get(k) is not None for x in mine) else None for k in cols}
        print(f"| {name} | " + " | ".join(fmt(med[k]) for k in cols) + " |")
    print("\nruns:", json.dumps([(r[0], r[1], {k: round(v, 3) for k, v in r[2].items()
                                               if v is not None}) for r in rows]))


if __name__ == "__main__":
    main()
