"""SQLite cache: TTL, threads, two processes, stats and clear."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from fake_clock import FakeTime

from amapreduce.web.cache import WebCache, normalize_url


def test_put_get_and_ttl(tmp_path: Path) -> None:
    time = FakeTime()
    time.now = 1000.0
    cache = WebCache(tmp_path / "c.sqlite3", ttl_s=60, clock=time.clock)
    assert cache.get("search", "q") is None
    cache.put("search", "q", '["a"]')
    assert cache.get("search", "q") == '["a"]'
    assert cache.get("page", "q") is None  # kinds are separate
    time.now += 61
    assert cache.get("search", "q") is None
    assert cache.counts() == (1, 3)
    stats = cache.stats()
    assert stats.entries == {} and stats.expired == 1 and stats.bytes > 0


def test_ttl_zero_disables(tmp_path: Path) -> None:
    cache = WebCache(tmp_path / "c.sqlite3", ttl_s=0)
    cache.put("page", "u", "x")
    assert cache.get("page", "u") is None
    assert not (tmp_path / "c.sqlite3").exists()


def test_clear_by_kind_and_all(tmp_path: Path) -> None:
    cache = WebCache.in_dir(tmp_path / "dir", ttl_s=100)
    cache.put("page", "a", "1")
    cache.put("search", "b", "2")
    cache.put("search", "c", "3")
    assert cache.stats().entries == {"page": 1, "search": 2}
    assert cache.clear("search") == 2
    assert cache.clear() == 1
    assert cache.stats().entries == {}


def test_threads_share_the_cache(tmp_path: Path) -> None:
    cache = WebCache(tmp_path / "c.sqlite3", ttl_s=100)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(20):
                cache.put("page", f"{i}-{j}", str(j))
                assert cache.get("page", f"{i}-{j}") == str(j)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert cache.stats().entries == {"page": 120}


def test_cache_is_shared_across_two_processes(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    script = textwrap.dedent("""
        import sys
        from pathlib import Path
        from amapreduce.web.cache import WebCache
        cache = WebCache(Path(sys.argv[1]), ttl_s=3600)
        if sys.argv[2] == "write":
            for i in range(50):
                cache.put("search", f"k{i}", f"v{i}")
        else:
            print(sum(cache.get("search", f"k{i}") == f"v{i}" for i in range(50)))
    """)
    writers = [subprocess.Popen([sys.executable, "-c", script, str(path), "write"]) for _ in range(2)]
    assert [w.wait(timeout=60) for w in writers] == [0, 0]
    reader = subprocess.run([sys.executable, "-c", script, str(path), "read"], capture_output=True, text=True,
                            timeout=60, check=True)
    assert reader.stdout.strip() == "50"


def test_normalize_url() -> None:
    assert normalize_url("HTTP://Example.COM:80?b=2&a=1#frag") == "http://example.com/?a=1&b=2"
    assert normalize_url("https://example.com:443/x") == normalize_url("https://EXAMPLE.com/x")
    assert normalize_url("http://example.com:8080/x") == "http://example.com:8080/x"
    assert normalize_url("http://example.com/a") != normalize_url("http://example.com/b")
