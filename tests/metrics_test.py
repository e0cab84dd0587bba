#!/usr/bin/env python3
"""The daemon's metrics, as a Prometheus server sees them.

Starts a real depotd with --metrics-port, drives traffic with depotctl, scrapes GET /metrics
with a real HTTP client, and parses the text with prometheus_client's own parser.
Run by ctest: metrics_test.py --depotd PATH --depotctl PATH
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

ARGS = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MetricsEndpointTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="depot-metrics-")
        self.socket = os.path.join(self.dir.name, "depot.sock")
        self.port = free_port()
        self.log = open(os.path.join(self.dir.name, "depotd.log"), "w+")
        self.daemon = subprocess.Popen(
            [ARGS.depotd, "--socket", self.socket, "--memory", "64MiB",
             "--metrics-port", str(self.port),
             # Two simulated GPUs, so the per-GPU series are parsed too.
             "--simulate-gpus", "2:64MiB", "--gpu-memory", "0:16MiB,1:32MiB",
             "--gpu-chunk-size", "8MiB"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.02)
        else:
            self.fail("depotd did not open its metrics port:\n" + self.daemon_log())

    def tearDown(self):
        self.daemon.send_signal(signal.SIGTERM)
        self.assertEqual(self.daemon.wait(timeout=10), 0, self.daemon_log())
        self.log.close()
        self.dir.cleanup()

    def daemon_log(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def depotctl(self, *args, check=True):
        return subprocess.run([ARGS.depotctl, "--socket", self.socket, *args],
                              capture_output=True, text=True, check=check, timeout=30)

    def scrape(self):
        url = "http://127.0.0.1:%d/metrics" % self.port
        with urllib.request.urlopen(url, timeout=5) as response:
            self.assertEqual(response.status, 200)
            self.assertTrue(response.headers["Content-Type"].startswith("text/plain; version=0.0.4"))
            text = response.read().decode()
        return {family.name: family for family in text_string_to_metric_families(text)}

    @staticmethod
    def value(family, name, **labels):
        matches = [s.value for s in family.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
        if len(matches) != 1:
            raise AssertionError("%d samples %s%s" % (len(matches), name, labels))
        return matches[0]

    def test_scrape_parses_and_counts_traffic(self):
        payload = os.urandom(3 * 1024 * 1024 + 11)
        path = os.path.join(self.dir.name, "input.bin")
        with open(path, "wb") as f:
            f.write(payload)
        self.depotctl("put", path, "--name", "m")
        self.depotctl("get", "m", "-o", os.path.join(self.dir.name, "out.bin"))
        self.assertNotEqual(self.depotctl("put", path, "--name", "m", check=False).returncode, 0)

        families = self.scrape()
        for name in ("depot_up", "depot_capacity_bytes", "depot_used_bytes", "depot_objects",
                     "depot_requests", "depot_request_duration_seconds", "depot_bytes_in",
                     "depot_get_objects", "depot_sessions", "depot_errors"):
            self.assertIn(name, families, sorted(families))

        self.assertEqual(self.value(families["depot_up"], "depot_up"), 1)
        self.assertEqual(self.value(families["depot_capacity_bytes"], "depot_capacity_bytes", tier="host"),
                         64 * 1024 * 1024)
        for gpu, limit in (("gpu0", 16), ("gpu1", 32)):
            self.assertEqual(self.value(families["depot_capacity_bytes"], "depot_capacity_bytes",
                                        tier=gpu), limit * 1024 * 1024)
            self.assertEqual(self.value(families["depot_used_bytes"], "depot_used_bytes", tier=gpu), 0)
            self.assertEqual(self.value(families["depot_bytes_in"], "depot_bytes_in_total", tier=gpu), 0)
            self.assertEqual(self.value(families["depot_tier_objects"], "depot_tier_objects",
                                        tier=gpu), 0)
        self.assertEqual(self.value(families["depot_replicas"], "depot_replicas_total", event="made"), 0)
        self.assertEqual(self.value(families["depot_spills"], "depot_spills_total"), 0)
        self.assertEqual(self.value(families["depot_page_locked_bytes"], "depot_page_locked_bytes",
                                    tier="host"), 0)
        self.assertEqual(self.value(families["depot_objects"], "depot_objects", state="sealed"), 1)
        self.assertEqual(self.value(families["depot_tier_objects"], "depot_tier_objects",
                                    tier="host"), 1)
        self.assertEqual(self.value(families["depot_bytes_in"], "depot_bytes_in_total", tier="host"),
                         len(payload))
        self.assertEqual(self.value(families["depot_bytes_out"], "depot_bytes_out_total", tier="host"),
                         len(payload))
        gets = families["depot_get_objects"]
        self.assertEqual(self.value(gets, "depot_get_objects_total", result="hit"), 1)
        self.assertEqual(self.value(families["depot_errors"], "depot_errors_total", code="AlreadyExists"), 1)
        sessions = families["depot_sessions"]
        self.assertEqual(self.value(sessions, "depot_sessions_total", event="opened"), 3)
        self.assertEqual(self.value(sessions, "depot_sessions_total", event="protocol_error"), 0)

        requests = families["depot_requests"]
        self.assertEqual(self.value(requests, "depot_requests_total", type="get"), 1)
        self.assertEqual(self.value(requests, "depot_requests_total", type="hello"), 3)

        # The histogram is well formed: cumulative buckets ending in +Inf == count.
        hist = families["depot_request_duration_seconds"]
        buckets = [(float(s.labels["le"]), s.value) for s in hist.samples
                   if s.name.endswith("_bucket") and s.labels["type"] == "get"]
        self.assertGreater(len(buckets), 10)
        self.assertEqual([b[0] for b in buckets], sorted(b[0] for b in buckets))
        counts = [b[1] for b in buckets]
        self.assertEqual(counts, sorted(counts), "buckets must be cumulative")
        self.assertEqual(buckets[-1][0], float("inf"))
        self.assertEqual(buckets[-1][1], self.value(hist, "depot_request_duration_seconds_count", type="get"))
        self.assertGreater(self.value(hist, "depot_request_duration_seconds_sum", type="get"), 0)

    def test_depotctl_metrics_prints_the_same_families_as_the_endpoint(self):
        text = self.depotctl("metrics").stdout
        families = {f.name: f for f in text_string_to_metric_families(text)}
        self.assertEqual(set(families), set(self.scrape()))
        # depotctl's own request shows: it asked for the metrics over the socket.
        self.assertGreaterEqual(self.value(families["depot_sessions"], "depot_sessions_total",
                                           event="opened"), 1)

    def test_depotctl_metrics_without_a_daemon_fails_clearly(self):
        result = subprocess.run([ARGS.depotctl, "--socket", os.path.join(self.dir.name, "none.sock"),
                                 "metrics"], capture_output=True, text=True, timeout=30)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("no depot daemon is listening", result.stderr)

    def test_other_paths_and_methods_are_refused(self):
        base = "http://127.0.0.1:%d" % self.port
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + "/", timeout=5)
        self.assertEqual(e.exception.code, 404)
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(base + "/metrics", data=b"x", method="POST"), timeout=5)
        self.assertEqual(e.exception.code, 405)

    def test_garbage_on_the_metrics_port_leaves_the_daemon_serving(self):
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"\x00\xff garbage that is not HTTP\r\n\r\n" * 100)
            s.settimeout(5)
            try:
                s.recv(100)
            except OSError:
                pass
        # An oversized request header is refused too.
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nX-Long: " + b"a" * 20000 + b"\r\n\r\n")
        self.assertIn("depot_up", self.scrape())
        self.assertEqual(self.depotctl("status").returncode, 0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--depotd", required=True)
    parser.add_argument("--depotctl", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], "-v"] + rest)
