"""bench_real.py workload: CPython (PYTHONMALLOC=malloc) doing JSON, zlib and regular expressions."""

import json
import re
import zlib

data = [{"id": i, "name": f"item-{i}", "tags": [str(j) for j in range(i % 7)], "v": i * 0.5} for i in range(60000)]
for _ in range(3):
    text = json.dumps(data)
    back = json.loads(text)
    packed = zlib.compress(text.encode(), 6)
    assert zlib.decompress(packed).decode() == text
    words = re.findall(r"item-(\d+)", text)
    n = sum(1 for w in words if re.match(r"\d*7$", w))
print(len(back), len(packed), n)
