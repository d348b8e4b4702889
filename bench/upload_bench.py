#!/usr/bin/env python3
"""Throughput of an upload through `quarry upload-proxy` into `quarry upload-server`, against
writing the same image with `quarry import` from a local file, in ONE run on this machine.

Rows (each writes a fresh disk.img and is timed to the point the image is written and fsynced):
  import:file       quarry import IMAGE disk.img                      (local file, random access)
  import:stdin      cat IMAGE | quarry import - disk.img              (the same stream, no HTTP)
  upload:direct     curl -T IMAGE .../v1beta1/upload straight to the upload server (no proxy)
  upload:curl       the same request through the proxy (virtctl's request; the sync path answers
                    after the image is written and synced)
  upload:forwarder  the same request through a minimal byte forwarder instead of the proxy (this
                    script, `--forward`: splice(2) between the two sockets, no HTTP, no token):
                    the floor any proxy pays on this machine for one more loopback TCP hop
  upload:quarry     quarry upload IMAGE --url PROXY                   (async path; timed until the
                    upload server exits, which it does once the image is written and synced)
Server and proxy start (and the token) are outside the timings. The proxy's own cost is
upload:curl against upload:direct, and against upload:forwarder what it costs beyond the TCP hop
itself; the CPU seconds of the hop (proxy or forwarder, user + system, from wait4) are reported
too; the whole upload path's cost is the upload rows against
import:stdin (same single-pass streaming pipeline, plus two HTTP hops on loopback);
import:file reads a local qcow2 by random access instead. Every output is compared with qemu-img's
conversion (sha256 of the raw bytes). Wall times on shared machines move with load: compare only
numbers of the same run.

Usage:
  python3 bench/upload_bench.py [--quarry target/release/quarry] [--size-mib 1024] [--repeat 3]
                                [--format qcow2|raw] [--workdir DIR]
Requires: python3 (standard library only), qemu-img, curl, openssl-free (keys come from
`quarry upload-token keygen`).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.time() + 20
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited early with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    sys.exit(f"{what} did not listen on {port}")


def make_image(work: Path, size_mib: int, fmt: str) -> tuple[Path, str]:
    """A seeded disk (60% incompressible 1 MiB blocks, 40% zero runs), as raw or qcow2, and the
    sha256 of qemu-img's raw conversion."""
    raw = work / "source.raw"
    rng = random.Random(20261123)
    with open(raw, "wb") as f:
        for _ in range(size_mib):
            f.write(rng.randbytes(MiB) if rng.random() < 0.6 else bytes(MiB))
    image = raw
    if fmt == "qcow2":
        image = work / "source.qcow2"
        subprocess.run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(image)], check=True)
    ref = work / "reference.raw"
    subprocess.run(["qemu-img", "convert", "-O", "raw", str(image), str(ref)], check=True)
    digest = sha256(ref)
    ref.unlink()
    if image != raw:
        raw.unlink()
    return image, digest


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * MiB):
            h.update(chunk)
    return h.hexdigest()


def fresh(target: Path) -> None:
    if target.exists():
        target.unlink()
    subprocess.run(["sync"], check=True)


def prewarm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(8 * MiB):
            pass


def forward(listen_port: int, upstream_port: int) -> None:
    """A minimal TCP forwarder: each connection is spliced to a new upstream connection, both
    ways, until SIGTERM."""
    import threading

    def pump(src: socket.socket, dst: socket.socket) -> None:
        r, w = os.pipe()
        try:
            while n := os.splice(src.fileno(), w, MiB):
                while n:
                    n -= os.splice(r, dst.fileno(), n)
        except OSError:
            pass
        finally:
            os.close(r)
            os.close(w)
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def serve(client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", upstream_port)) as up:
            back = threading.Thread(target=pump, args=(up, client))
            back.start()
            pump(client, up)
            back.join()

    with socket.create_server(("127.0.0.1", listen_port)) as listener:
        while True:
            client, _ = listener.accept()
            threading.Thread(target=serve, args=(client,), daemon=True).start()


def reap(p: subprocess.Popen) -> float:
    """Waits for `p`; returns its CPU seconds (user + system)."""
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return ru.ru_utime + ru.ru_stime


class Upload:
    """An upload server (for `target`) behind a hop (`quarry upload-proxy`, or the byte forwarder
    of `forward`); stopped by PID."""

    def __init__(self, quarry: str, work: Path, target: Path, public: Path, hop: str = "proxy"):
        self.sport, self.pport = free_port(), free_port()
        log = open(work / "server.log", "ab")
        self.server = subprocess.Popen(
            [quarry, "upload-server", "--target", str(target), "--listen", f"127.0.0.1:{self.sport}"],
            stdout=subprocess.DEVNULL, stderr=log)
        if hop == "proxy":
            argv = [quarry, "upload-proxy", "--public-key", str(public), "--listen",
                    f"127.0.0.1:{self.pport}", "--upstream",
                    f"bench/disk=http://127.0.0.1:{self.sport}"]
        else:
            argv = [sys.executable, __file__, "--forward", str(self.pport), str(self.sport)]
        self.hop = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
        wait_listening(self.sport, self.server, "upload-server")
        wait_listening(self.pport, self.hop, hop)
        self.url = f"http://127.0.0.1:{self.pport}"
        self.hop_cpu = 0.0

    def wait_server(self) -> int:
        reap(self.server)
        return self.server.returncode

    def stop(self) -> None:
        for p in (self.hop, self.server):
            if p.returncode is None and p.poll() is None:
                p.terminate()
                cpu = reap(p)
                if p is self.hop:
                    self.hop_cpu = cpu


def timed(argv, **kw) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, **kw)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quarry", default="target/release/quarry")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--format", choices=["qcow2", "raw"], default="qcow2")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--forward", nargs=2, type=int, metavar=("LISTEN", "UPSTREAM"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.forward:
        forward(*args.forward)
        return 0
    quarry = str(Path(args.quarry).resolve())
    work = Path(args.workdir or tempfile.mkdtemp(prefix="upload-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        image, expected = make_image(work, args.size_mib, args.format)
        private, public = work / "signer.key", work / "signer.pub"
        subprocess.run([quarry, "upload-token", "keygen", "--private", str(private), "--public",
                        str(public)], check=True, capture_output=True)
        target = work / "vol" / "disk.img"
        target.parent.mkdir(exist_ok=True)
        size = image.stat().st_size
        best: dict[str, float] = {}
        hop_cpu: dict[str, float] = {}
        bad = []

        def record(row: str, seconds: float) -> None:
            best[row] = min(seconds, best.get(row, float("inf")))
            if sha256(target) != expected:
                bad.append(row)

        for _ in range(args.repeat):
            prewarm(image)
            fresh(target)
            record("import:file", timed([quarry, "import", str(image), str(target)],
                                        stderr=subprocess.DEVNULL))
            fresh(target)
            with open(image, "rb") as src:
                record("import:stdin", timed([quarry, "import", "-", str(target)], stdin=src,
                                             stderr=subprocess.DEVNULL))
            for row in ("upload:direct", "upload:curl", "upload:forwarder", "upload:quarry"):
                fresh(target)
                up = Upload(quarry, work, target, public,
                            "forwarder" if row == "upload:forwarder" else "proxy")
                token = subprocess.run(
                    [quarry, "upload-token", "--namespace", "bench", "--pvc", "disk", "--key",
                     str(private)], check=True, capture_output=True, text=True).stdout.strip()
                try:
                    t = time.perf_counter()
                    if row != "upload:quarry":
                        url = (f"http://127.0.0.1:{up.sport}" if row == "upload:direct"
                               else up.url)
                        out = subprocess.run(
                            ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
                             "-T", str(image), "-H", "Expect:", "-H",
                             "Content-Type: application/octet-stream", "-H",
                             f"Authorization: Bearer {token}", f"{url}/v1beta1/upload"],
                            check=True, capture_output=True, text=True)
                        if out.stdout.strip() != "200":
                            sys.exit(f"curl upload answered {out.stdout}")
                    else:
                        subprocess.run([quarry, "upload", str(image), "--url", up.url, "--token",
                                        token], check=True, stderr=subprocess.DEVNULL)
                    if up.wait_server() != 0:
                        sys.exit("the upload server failed")
                    record(row, time.perf_counter() - t)
                finally:
                    up.stop()
                if row != "upload:direct":
                    hop_cpu[row] = min(up.hop_cpu, hop_cpu.get(row, float("inf")))

        base = best["import:stdin"]
        print(f"\n{args.format} image of {size / MiB:.0f} MiB ({args.size_mib} MiB virtual), "
              f"best of {args.repeat}, {os.cpu_count()} CPUs\n")
        print("| row | seconds | MB/s of image | vs import:file | vs import:stdin | vs upload:direct "
              "| hop CPU s |")
        print("|---|---|---|---|---|---|---|")
        for row in ("import:file", "import:stdin", "upload:direct", "upload:curl",
                    "upload:forwarder", "upload:quarry"):
            s = best[row]
            cpu = f"{hop_cpu[row]:.2f}" if row in hop_cpu else ""
            print(f"| {row} | {s:.2f} | {size / s / 1e6:.0f} | {s / best['import:file']:.2f} | "
                  f"{s / base:.2f} | {s / best['upload:direct']:.2f} | {cpu} |")
        if bad:
            print(f"\nOUTPUT MISMATCH in {sorted(set(bad))}")
            return 1
        return 0
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
