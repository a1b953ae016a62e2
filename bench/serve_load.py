#!/usr/bin/env python3
"""Load generator for `tandem serve` (or any OpenAI-compatible server): C concurrent streaming clients, each
sending completions back to back for D seconds; optionally aborting a fraction of them mid-stream. Reports,
per concurrency level: requests done / aborted / failed, generated tokens/s, p50/p99 time to first token and
inter-token latency, and the server's KV use and RSS (from /metrics and /proc when the pid is given).

    bench/serve_load.py --url http://127.0.0.1:8080 --concurrency 1,4,16,64 --duration 30 [--abort 0.1]

Standard library only (threads + http.client), so it runs wherever python3 does. A request counts as lost
when it neither finished with a finish_reason nor was aborted by us: the run prints them and exits 1.
"""
import argparse
import http.client
import json
import random
import subprocess
import threading
import time
import urllib.parse

WORDS = ("once upon a time there was a little cat who lived in a house by the sea and every day the cat "
         "went out to look for fish in the water").split()


def pct(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))]


def metric(host, port, name, headers):
    try:
        c = http.client.HTTPConnection(host, port, timeout=10)
        c.request("GET", "/metrics", headers=headers)
        body = c.getresponse().read().decode()
        for line in body.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    except OSError:
        pass
    return float("nan")


def vram_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return sum(float(x) for x in out.split())
    except (OSError, ValueError, subprocess.SubprocessError):
        return float("nan")


def rss_mib(pid):
    if not pid:
        return float("nan")
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.ttft, self.itl = [], []
        self.done = self.aborted = self.failed = self.tokens = 0
        self.text_chunks = 0  # streamed chunks that carried text (what TTFT / ITL are measured on)
        self.errors = []


def client(args, host, port, headers, stats, stop_at, rng):
    while time.time() < stop_at:
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, args.prompt_words)))
        body = json.dumps({"prompt": prompt, "max_tokens": args.max_tokens, "temperature": args.temperature,
                           "seed": rng.randint(0, 1 << 30), "stream": True, "ignore_eos": True,
                           "stream_options": {"include_usage": True}})
        abort_after = rng.randint(1, args.max_tokens) if rng.random() < args.abort else None
        t0 = time.time()
        last, n, finish, usage_tokens = None, 0, None, None
        try:
            c = http.client.HTTPConnection(host, port, timeout=args.timeout)
            c.request("POST", "/v1/completions", body=body, headers={**headers, "Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                if line == b"data: [DONE]":
                    break
                chunk = json.loads(line[6:])
                now = time.time()
                if isinstance(chunk.get("usage"), dict):  # the generated-token count, text or not
                    usage_tokens = chunk["usage"].get("completion_tokens")
                for ch in chunk.get("choices", []):
                    if ch.get("finish_reason"):
                        finish = ch["finish_reason"]
                    if ch.get("text"):
                        with stats.lock:
                            if last is None:
                                stats.ttft.append(now - t0)
                            else:
                                stats.itl.append(now - last)
                        last = now
                        n += 1
                if abort_after is not None and n >= abort_after:
                    break
            c.close()
            with stats.lock:
                # Tokens: the server's usage count when it sent one (a token whose text is empty or held back
                # streams no chunk), else the text chunks seen (an aborted stream ends before the usage).
                stats.tokens += usage_tokens if isinstance(usage_tokens, int) else n
                stats.text_chunks += n
                if abort_after is not None and finish is None:
                    stats.aborted += 1
                elif finish:
                    stats.done += 1
                else:
                    stats.failed += 1
                    stats.errors.append("stream ended without a finish_reason")
        except Exception as e:  # noqa: BLE001 - every failure is counted and shown
            with stats.lock:
                stats.failed += 1
                stats.errors.append(str(e))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--concurrency", default="1,4,16,64", help="comma-separated client counts")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds per concurrency level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.8, help="0: greedy clients")
    ap.add_argument("--prompt-words", type=int, default=48)
    ap.add_argument("--abort", type=float, default=0.0, help="fraction of requests aborted mid-stream")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a request may take")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--pid", type=int, default=0, help="server pid, for its RSS")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-kv-check", action="store_true",
                    help="the server has no tandem_kv_cells_used metric (llama-server): skip the KV checks")
    ap.add_argument("--vram", action="store_true", help="also sample the GPU memory in use (nvidia-smi)")
    ap.add_argument("--json", default="", help="write the results of every level to this file")
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    host, port = u.hostname, u.port or 80
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}

    print(f"{'clients':>7} {'done':>6} {'abort':>6} {'fail':>5} {'tok/s':>9} {'ttft p50':>9} {'ttft p99':>9} "
          f"{'itl p50':>8} {'itl p99':>8} {'kv peak':>8} {'rss MiB':>8}")
    lost = 0
    results = []
    for conc in [int(x) for x in args.concurrency.split(",")]:
        stats = Stats()
        stop_at = time.time() + args.duration
        t0 = time.time()
        threads = [threading.Thread(target=client,
                                    args=(args, host, port, headers, stats, stop_at,
                                          random.Random(args.seed * 1000 + i)))
                   for i in range(conc)]
        kv_peak = 0.0
        # RSS (and VRAM) over the run: one sample per 10% of the duration, to show whether they stay flat.
        samples, next_sample = [], t0
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            kv = metric(host, port, "tandem_kv_cells_used", headers)
            if kv == kv:  # not NaN
                kv_peak = max(kv_peak, kv)
            if time.time() >= next_sample:
                samples.append((round(time.time() - t0), round(rss_mib(args.pid), 1),
                                round(vram_mib(), 1) if args.vram else None))
                next_sample += max(1.0, args.duration / 10)
            time.sleep(0.5)
        for t in threads:
            t.join()
        wall = time.time() - t0
        samples.append((round(wall), round(rss_mib(args.pid), 1), round(vram_mib(), 1) if args.vram else None))
        lost += stats.failed
        print(f"{conc:>7} {stats.done:>6} {stats.aborted:>6} {stats.failed:>5} {stats.tokens / wall:>9.1f} "
              f"{pct(stats.ttft, .5) * 1e3:>7.1f}ms {pct(stats.ttft, .99) * 1e3:>7.1f}ms "
              f"{pct(stats.itl, .5) * 1e3:>6.1f}ms {pct(stats.itl, .99) * 1e3:>6.1f}ms {kv_peak:>8.0f} "
              f"{rss_mib(args.pid):>8.1f}", flush=True)
        print("        rss MiB over time (s: MiB): " + ", ".join(f"{t}: {r}" for t, r, _ in samples))
        if args.vram:
            print("        GPU memory MiB over time (s: MiB): " + ", ".join(f"{t}: {v}" for t, _, v in samples))
        for e in sorted(set(stats.errors))[:5]:
            print(f"        error: {e}")
        if stats.text_chunks < stats.tokens // 2:  # TTFT / ITL come from text chunks: say when they are few
            print(f"        WARNING: only {stats.text_chunks} of {stats.tokens} generated tokens streamed text; time "
                  "to first token and inter-token latency are measured on those chunks (a vocabulary with "
                  "empty-text tokens?)")
        results.append({"clients": conc, "done": stats.done, "aborted": stats.aborted, "lost": stats.failed,
                        "seconds": wall, "tokens": stats.tokens, "tokens_per_s": stats.tokens / wall,
                        "text_chunks": stats.text_chunks,
                        "ttft_p50_ms": pct(stats.ttft, .5) * 1e3, "ttft_p99_ms": pct(stats.ttft, .99) * 1e3,
                        "itl_p50_ms": pct(stats.itl, .5) * 1e3, "itl_p99_ms": pct(stats.itl, .99) * 1e3,
                        "kv_peak": kv_peak, "samples": samples, "errors": sorted(set(stats.errors))[:5]})
    # After the load, every cell must be free again (aborted streams included).
    time.sleep(1.0)
    kv_after = 0.0 if args.no_kv_check else metric(host, port, "tandem_kv_cells_used", headers)
    if not args.no_kv_check:
        print(f"kv cells used after the load: {kv_after:.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"levels": results, "kv_after": kv_after, "lost": lost}, f, indent=1)
    if lost or kv_after != 0:
        print(f"FAIL: {lost} request(s) lost, {kv_after:.0f} KV cells still used")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
