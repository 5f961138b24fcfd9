"""Device specifications: a catalog of common CPUs, GPUs, Apple chips and edge boards, and lookup.

Figures are public peak specs (memory bandwidth, dense fp16 matrix rate the runtimes can use, memory
size); they are rounded and for the most common variant. Lookup is by normalised name with fuzzy
token matching; an unknown device returns None and the caller widens its error band.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

# Device classes the learned part is keyed by.
CLASSES = ("discrete_gpu", "apple", "unified_soc", "cpu")
# An AMD x86 CPU by its name (the catalog's "EPYC 9654", "Ryzen 9 7950X", a measured machine's
# "AMD EPYC x2 (...)"): torch's CPU builds run their float matrix-vector products through
# MKL, which keeps them on one thread on these (DeviceSpec.amd_cpu, roofline.mkl_one_thread).
_AMD_CPU = re.compile(r"\b(amd|epyc|ryzen|threadripper|opteron|athlon)\b", re.IGNORECASE)


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or CPU socket). `memory_gb` is per device; `device_count` devices in total."""

    name: str
    kind: str  # gpu | cpu | apple | igpu | edge
    memory_gb: float
    bandwidth_gbps: float
    fp16_tflops: float
    compute_units: int
    simd_width: int = 32
    unified: bool = False
    host_bandwidth_gbps: float = 50.0
    host_memory_gb: float | None = None
    link_gbps: float = 16.0
    device_count: int = 1
    cpu_cores: int | None = None
    # dies that share the memory system: Apple's Ultra chips are two Max dies joined by a
    # bridge, and llama.cpp's decode reaches a smaller share of their summed bandwidth
    dies: int = 1
    # A device measured rather than looked up (`tightfit calibrate`, the bench's rows): the
    # copy rate measured, GB/s read + written. `bandwidth_gbps` is then its rated equivalent,
    # copy / COPY_OF_PEAK, so that the engines' efficiencies mean one thing on every device.
    copy_bandwidth_gbps: float | None = None
    # A CPU measured on a hand-written SIMD block-format kernel (the lite runtime's Q4_0
    # matrix-vector product, `fingerprint.measure_kernel_gflops`) on its threads, GFLOP/s:
    # what llama.cpp's and the lite runtime's kernels, and tightfit's integer ones, run at.
    kernel_gflops: float | None = None
    # A measured CPU: what its threads stream over what a one-thread copy says (a copy split
    # over them / a one-thread copy; 1.84 on the 2-core Xeon VM at two threads). The analytic
    # base's memory terms use it; the residual's bandwidth features do not (held out by device,
    # scaling `bandwidth_gbps` itself moved prefill 16.0% -> 18.0% and TTFT 21.3% -> 24.4%
    # through the features, this 16.0% / 21.4%; docs/predictor.md). 1 elsewhere.
    threads_bandwidth_gain: float = 1.0
    # A measured CPU: the rate at which the hand-written kernel streams a matrix larger than the
    # caches (`fingerprint.measure_kernel_stream_gbps`) as a share of a copy on the same threads
    # (0.34 on the Xeon VM at one thread and at two, 0.98 on the EPYC VM at two). None: not
    # measured (every catalog entry).
    kernel_stream_share: float | None = None

    @property
    def stream_rel(self) -> float:
        """How fast the SIMD kernels stream weights on this CPU relative to what its copy rate
        says: the measured share over KERNEL_STREAM_SHARE_OF_COPY, within [0.25, 4]. 1 where
        none was measured."""
        if self.kernel_stream_share is None or self.kind != "cpu":
            return 1.0
        return _rel(self.kernel_stream_share, KERNEL_STREAM_SHARE_OF_COPY)

    @property
    def kernel_rel(self) -> float:
        """The SIMD kernels' speed on this CPU relative to what its fp32 GEMM rate says: the
        measured kernel / GEMM share over KERNEL_SHARE_OF_GEMM, within [0.25, 4]. 1 where no
        kernel rate was measured (every catalog entry)."""
        if self.kernel_gflops is None or self.kind != "cpu" or self.fp16_tflops <= 0:
            return 1.0
        return _rel(self.kernel_gflops / (self.fp16_tflops * 1000.0), KERNEL_SHARE_OF_GEMM)

    @property
    def amd_cpu(self) -> bool:
        """A CPU whose name says AMD (EPYC, Ryzen, Threadripper, ...); False for other CPUs,
        a CPU named by its memory alone ("Desktop x86 2ch DDR4-3200") and every other kind."""
        return self.kind == "cpu" and bool(_AMD_CPU.search(self.name))

    @property
    def device_class(self) -> str:
        if self.kind == "apple":
            return "apple"
        if self.kind == "cpu":
            return "cpu"
        if self.unified or self.kind in ("igpu", "edge"):
            return "unified_soc"
        return "discrete_gpu"


def _g(name: str, mem: float, bw: float, tf: float, cu: int, **kw: object) -> DeviceSpec:
    return DeviceSpec(name, "gpu", mem, bw, tf, cu, **kw)  # type: ignore[arg-type]


def _a(name: str, mem: float, bw: float, cores: int, per_core_tf: float) -> DeviceSpec:
    return DeviceSpec(name, "apple", mem, bw, cores * per_core_tf, cores, 32, True, bw, None, bw)


# The share of a CPU's rated memory bandwidth a one-thread numpy copy (read + write) reaches.
# Device specs and the engines' priors are in rated bandwidth; a measured copy rate is not one:
# on this project's machine llama.cpp streams F16 weights at 0.82-0.88 of the copy rate (22-24
# GB/s of 26.6 at two threads, bench rows of 2026-12-05), where its prior, from the public
# tables' rated figures, is 0.6 of the rated bandwidth; 0.6 / 0.85 = 0.7, within the 0.6-0.8
# that copy benchmarks reach of a desktop or server's rated DRAM bandwidth. Held out by
# device (docs/predictor.md), reading the copy rate as rated had put llama.cpp's F16 rows
# 0.44-0.66 too slow in log space.
COPY_OF_PEAK = 0.7
# The block-format kernel's rate (DeviceSpec.kernel_gflops) as a share of the fp32 GEMM probe on
# the machine the engines' CPU priors were measured on (the 2-core AMD EPYC VM: tf_linear Q4_0,
# one token, 4096 x 4096, one thread, 52.1 GFLOP/s, 2026-12-05 09:26 UTC; its rows' one-thread
# GEMM probe, median 101.8). The priors' compute efficiencies mean "of the GEMM rate, on a CPU
# whose kernels run at this share of it"; a CPU measured at another share has its SIMD-kernel
# compute scaled by the ratio (roofline.kernel_scale).
KERNEL_SHARE_OF_GEMM = 0.51
# The same kernel's streaming rate as a share of a copy on the same threads, on that machine:
# tf_linear Q8_0, one token, 8192 x 8192, two threads, best of 15, 25 GB/s against its 25.6 GB/s
# copy (2026-12-04, the lite priors' component measurement, docs/performance.md); the EPYC's
# copy gain from a second thread was not measured and is taken as 1.
KERNEL_STREAM_SHARE_OF_COPY = 0.98


def _rel(share: float, reference: float) -> float:
    """A measured share over the priors' machine's, within [0.25, 4]: a typo or a stalled probe
    cannot make a CPU more than 4x slower or faster than its other figures say."""
    return max(0.25, min(4.0, share / reference))


def _c(name: str, mem: float, bw: float, cores: int, gflops_core: float, simd: int = 8) -> DeviceSpec:
    return DeviceSpec(name, "cpu", mem, bw, cores * gflops_core / 1000.0, cores, simd, True, bw,
                      None, bw, 1, cores)


def measured_cpu(name: str, memory_gb: float, copy_gbps: float, gflops: float,
                 cores: int, kernel_gflops: float | None = None,
                 threads_bandwidth_gain: float = 1.0,
                 kernel_stream_share: float | None = None) -> DeviceSpec:
    """A CPU described by measurements: `copy_gbps` the copy rate (read + write), `gflops` the
    matrix rate of the cores it may use, `kernel_gflops` the block-format kernel's rate on them
    (None: not measured). Its bandwidth is the rated equivalent of the copy."""
    spec = _c(name, memory_gb, round(copy_gbps / COPY_OF_PEAK, 2), cores, gflops / cores)
    return replace(spec, fp16_tflops=gflops / 1000.0, copy_bandwidth_gbps=copy_gbps,
                   kernel_gflops=kernel_gflops, threads_bandwidth_gain=threads_bandwidth_gain,
                   kernel_stream_share=kernel_stream_share)


def _s(name: str, kind: str, mem: float, bw: float, tf: float, cu: int) -> DeviceSpec:
    return DeviceSpec(name, kind, mem, bw, tf, cu, 32, True, bw, None, bw)


# Apple GPU fp16 TFLOPS per GPU core by generation (approximate public figures).
_APPLE_TF = {"m1": 0.33, "m2": 0.36, "m3": 0.36, "m4": 0.43, "m5": 0.50}

CATALOG: tuple[DeviceSpec, ...] = (
    # NVIDIA / AMD / Intel discrete GPUs: dense fp16 matrix TFLOPS (tensor cores where present).
    _g("GeForce GTX 1050", 2, 112, 1.9, 5), _g("GeForce GTX 1050 Ti", 4, 112, 2.1, 6),
    _g("GeForce GTX 1060", 6, 192, 4.4, 10), _g("GeForce GTX 1070", 8, 256, 6.5, 15),
    _g("GeForce GTX 1080", 8, 320, 8.9, 20), _g("GeForce GTX 1080 Ti", 11, 484, 11.3, 28),
    _g("GeForce GTX 1650", 4, 128, 6.0, 14), _g("GeForce GTX 1660", 6, 192, 10, 22),
    _g("GeForce GTX 1660 SUPER", 6, 336, 10, 22), _g("GeForce GTX 1660 Ti", 6, 288, 11, 24),
    _g("GeForce RTX 2060", 6, 336, 52, 30), _g("GeForce RTX 2060 SUPER", 8, 448, 57, 34),
    _g("GeForce RTX 2070", 8, 448, 60, 36), _g("GeForce RTX 2080 SUPER", 8, 496, 89, 48),
    _g("GeForce RTX 2070 SUPER", 8, 448, 72, 40), _g("GeForce RTX 2080", 8, 448, 80, 46),
    _g("GeForce RTX 2080 Ti", 11, 616, 108, 68), _g("GeForce RTX 3050", 8, 224, 36, 20),
    _g("GeForce RTX 3060", 12, 360, 51, 28), _g("GeForce RTX 3060 Ti", 8, 448, 65, 38),
    _g("GeForce RTX 3070", 8, 448, 81, 46), _g("GeForce RTX 3070 Ti", 8, 608, 87, 48),
    _g("GeForce RTX 3080", 10, 760, 119, 68), _g("GeForce RTX 3080 Ti", 12, 912, 136, 80),
    _g("GeForce RTX 3090", 24, 936, 142, 82), _g("GeForce RTX 3090 Ti", 24, 1008, 160, 84),
    _g("GeForce RTX 4060", 8, 272, 60, 24), _g("GeForce RTX 4060 Ti", 8, 288, 88, 34),
    _g("GeForce RTX 4070", 12, 504, 117, 46), _g("GeForce RTX 4070 SUPER", 12, 504, 142, 56),
    _g("GeForce RTX 4070 Ti", 12, 504, 160, 60), _g("GeForce RTX 4070 Ti SUPER", 16, 672, 176, 66),
    _g("GeForce RTX 4080", 16, 717, 195, 76), _g("GeForce RTX 4080 SUPER", 16, 736, 209, 80),
    _g("GeForce RTX 4090", 24, 1008, 330, 128), _g("GeForce RTX 5060", 8, 448, 77, 30),
    _g("GeForce RTX 5060 Ti", 16, 448, 95, 36), _g("GeForce RTX 5070", 12, 672, 123, 48),
    _g("GeForce RTX 5070 Ti", 16, 896, 176, 70), _g("GeForce RTX 5080", 16, 960, 225, 84),
    _g("GeForce RTX 5090", 32, 1792, 419, 170),
    # laptop parts: other chips, memory and clocks than the desktop cards of the same number
    _g("GeForce RTX 3060 Laptop GPU", 6, 336, 52, 30),
    _g("GeForce RTX 4060 Laptop GPU", 8, 256, 58, 24),
    _g("GeForce RTX 4090 Laptop GPU", 16, 576, 160, 76),
    # (tensor rates scaled by CUDA cores from the two laptop entries above; a laptop's power
    # limit moves its clocks, and so these, by +-20%)
    _g("GeForce RTX 4050 Laptop GPU", 6, 192, 46, 20),
    _g("GeForce RTX 4070 Laptop GPU", 8, 256, 80, 36),
    _g("GeForce RTX 4080 Laptop GPU", 12, 432, 125, 58),
    _g("Tesla P40", 24, 347, 12, 30),  # fp16 runs at 1/64 rate: the fp32 figure
    _g("Tesla P100", 16, 732, 19, 56), _g("Tesla T4", 16, 320, 65, 40),
    _g("Tesla V100", 16, 900, 125, 80), _g("Tesla V100 SXM", 16, 900, 125, 80),
    _g("Tesla V100 PCIe", 16, 900, 112, 80), _g("A10G", 24, 600, 125, 80), _g("A10", 24, 600, 125, 72),
    _g("L4", 24, 300, 121, 58), _g("L40S", 48, 864, 362, 142), _g("A100 40GB", 40, 1555, 312, 108),
    _g("A100 80GB", 80, 2039, 312, 108), _g("A100 SXM 40GB", 40, 1555, 312, 108),
    _g("A100 SXM 80GB", 80, 2039, 312, 108), _g("A100 PCIe 40GB", 40, 1555, 312, 108),
    _g("A100 PCIe 80GB", 80, 1935, 312, 108), _g("H100 SXM", 80, 3350, 990, 132),
    _g("H100 PCIe", 80, 2000, 756, 114), _g("H100 NVL", 94, 3900, 835, 132),
    _g("H200", 141, 4800, 990, 132),
    _g("RTX A4000", 16, 448, 77, 48), _g("RTX A5000", 24, 768, 111, 64),
    _g("RTX A6000", 48, 768, 155, 84), _g("RTX 4000 Ada", 20, 360, 107, 48),
    _g("RTX 5880 Ada Generation", 48, 960, 277, 110), _g("RTX 6000 Ada", 48, 960, 364, 142),
    _g("RTX PRO 6000 Blackwell", 96, 1792, 500, 188), _g("Quadro RTX 8000", 48, 672, 130, 72),
    _g("B200", 180, 8000, 2250, 148),
    _g("Radeon RX 6600", 8, 224, 18, 28), _g("Radeon RX 6600 XT", 8, 256, 21, 32),
    _g("Radeon RX 6700 XT", 12, 384, 26, 40), _g("Radeon RX 6800", 16, 512, 32, 60),
    _g("Radeon RX 6800 XT", 16, 512, 41, 72), _g("Radeon RX 6900 XT", 16, 512, 46, 80),
    _g("Radeon RX 7600", 8, 288, 43, 32), _g("Radeon RX 7600 XT", 16, 288, 45, 32),
    _g("Radeon RX 7700 XT", 12, 432, 70, 54), _g("Radeon RX 7800 XT", 16, 624, 74, 60),
    _g("Radeon RX 7900 GRE", 16, 576, 92, 80), _g("Radeon RX 7900 XTX", 24, 960, 123, 96),
    _g("Radeon RX 7900 XT", 20, 800, 103, 84), _g("Radeon RX 9070", 16, 640, 145, 56),
    _g("Radeon RX 9070 XT", 16, 640, 195, 64), _g("Radeon VII", 16, 1024, 27, 60),
    _g("Instinct MI210", 64, 1638, 181, 104), _g("Instinct MI300X", 192, 5300, 1307, 304),
    _g("Arc A750", 8, 512, 118, 28), _g("Arc A770", 16, 560, 138, 32),
    _g("Arc B580", 12, 456, 117, 20),
    # Integrated GPUs and SoCs sharing system memory.
    _s("Arc Graphics 130V/140V (integrated)", "igpu", 32, 136, 16, 8),
    _s("Iris Xe Graphics (integrated)", "igpu", 32, 68, 4.4, 96),
    _s("Radeon 780M (integrated)", "igpu", 32, 90, 8.6, 12),
    _s("Radeon 840M / 860M Graphics", "igpu", 32, 120, 6, 8),
    _s("Radeon 890M (integrated)", "igpu", 32, 120, 12, 16),
    _s("Radeon 8060S (Ryzen AI Max+ 395)", "igpu", 128, 256, 30, 40),
    _s("NVIDIA GB10", "edge", 128, 273, 62, 48),
    _s("Jetson AGX Orin 64GB", "edge", 64, 204.8, 42, 16),
    _s("Jetson Orin NX 16GB", "edge", 16, 102.4, 19, 8),
    _s("Jetson Orin Nano 8GB", "edge", 8, 68, 10, 8),
    _s("Jetson Orin Nano Super 8GB", "edge", 8, 102, 16, 8),
    _s("Ascend 310P", "edge", 24, 204.8, 70, 8),
    # the first Jetson Nano (Maxwell, 128 CUDA cores), not the Orin Nano
    _s("Jetson Nano 4GB", "edge", 4, 25.6, 0.47, 1),
    # Steam Deck: 4 Zen 2 cores and an 8-CU RDNA 2 GPU on 16 GB of LPDDR5 (88 GB/s)
    _s("Steam Deck (Van Gogh APU)", "igpu", 16, 88, 3.2, 8),
    # Edge CPUs and common server/desktop CPUs (bandwidth = sustained-peak DRAM figure).
    _c("Raspberry Pi 5", 8, 17, 4, 19, 4), _c("Raspberry Pi 4", 8, 6, 4, 12, 4),
    _c("Orange Pi 5 (RK3588)", 16, 34, 8, 20, 4),
    _c("Desktop x86 2ch DDR4-3200", 32, 51, 8, 100), _c("Desktop x86 2ch DDR5-5600", 64, 90, 16, 110),
    _c("Xeon E5-2680 v4", 128, 77, 14, 77), _c("Core i9-10900X", 64, 94, 10, 120),
    _c("Core i9-13900", 32, 90, 24, 80), _c("Core i9-13900HK", 32, 83, 14, 90), _c("Core i5-6400", 16, 34, 4, 86),
    _c("Ryzen 5 7600X3D", 32, 83, 6, 150), _c("Ryzen Threadripper PRO 5945WX", 128, 204, 12, 110),
    _c("Ryzen AI 7 350", 32, 120, 8, 100), _c("EPYC 9654", 384, 460, 96, 120),
    _c("Xeon Gold 6132", 64, 128, 14, 140, 16), _c("Cortex-A725", 128, 273, 20, 40, 4),
    _c("Ryzen 7 5800X", 32, 51, 8, 140), _c("Ryzen 9 5900X", 64, 51, 12, 135),
    _c("Ryzen 9 5950X", 64, 51, 16, 130), _c("Ryzen 7 7800X3D", 32, 83, 8, 155),
    _c("Ryzen 9 7950X", 64, 83, 16, 160), _c("Ryzen 9 9950X", 64, 90, 16, 300, 16),
    _c("Core i7-12700K", 32, 77, 12, 100), _c("Core i9-13900K", 64, 90, 24, 85),
    _c("Core i9-14900K", 64, 90, 24, 90), _c("Core Ultra 7 155H", 32, 120, 16, 60),
    _c("Core Ultra 7 258V", 32, 136, 8, 70), _c("Intel N100", 16, 38, 4, 54),
    _c("Snapdragon X Elite", 32, 135, 12, 100, 4),
    _c("Xeon Platinum 8480+", 512, 307, 56, 120, 16), _c("EPYC 7763", 256, 205, 64, 78),
    _c("Graviton3", 128, 307, 64, 83), _c("Graviton4", 192, 537, 96, 90, 4),
    # more desktop, laptop and server CPUs people run llama.cpp on (rated DRAM bandwidth of the
    # usual memory: channels x transfer rate x 8 bytes; matrix rate per core as for the
    # entries above: AVX2 desktop ~100-160, hybrid Intel parts ~60-90 averaged over P and E
    # cores, Zen 4's double-pumped AVX-512 ~130-160)
    _c("Ryzen 5 5600X", 32, 51, 6, 140), _c("Ryzen 7 5800X3D", 32, 51, 8, 130),
    _c("Ryzen 5 7600X", 32, 83, 6, 160), _c("Ryzen 9 7950X3D", 64, 83, 16, 155),
    _c("Ryzen 7 7840U", 32, 102, 8, 130), _c("Ryzen 7 7840HS", 32, 90, 8, 140),
    _c("Ryzen 7 8845HS", 32, 90, 8, 140),
    _c("Ryzen Threadripper 7980X", 256, 166, 64, 150),
    _c("Ryzen Threadripper PRO 5995WX", 512, 204, 64, 110),
    _c("Core i5-12400", 32, 77, 6, 100), _c("Core i5-13600K", 32, 90, 14, 90),
    _c("Core i7-13700K", 64, 90, 16, 88), _c("Core i7-12700H", 32, 77, 14, 80),
    _c("Core i7-1165G7", 16, 68, 4, 100, 16), _c("Core Ultra 9 185H", 32, 120, 16, 60),
    _c("Core Ultra 9 285K", 64, 102, 24, 90),
    _c("Xeon Gold 6248R", 192, 141, 24, 140, 16), _c("Ampere Altra", 256, 204, 80, 48, 4),
    _c("Ampere Altra Max", 256, 204, 128, 45, 4),
    # older desktop and laptop CPUs still common for CPU-only llama.cpp (DDR4 at the platform's
    # rated speed, dual channel; AVX2 at ~32 FP32 FLOP a cycle and the all-core clock, less
    # for the sustained rate as above; Rocket Lake's and Tiger Lake's AVX-512 width 16)
    _c("Core i5-8400", 16, 42.7, 6, 100), _c("Core i7-8700", 16, 42.7, 6, 120),
    _c("Core i7-8700K", 16, 42.7, 6, 130), _c("Core i7-9700K", 32, 42.7, 8, 130),
    _c("Core i9-9900K", 32, 42.7, 8, 135), _c("Core i5-10400", 16, 42.7, 6, 115),
    _c("Core i7-10700K", 32, 46.9, 8, 135), _c("Core i9-10900K", 64, 46.9, 10, 135),
    _c("Core i5-11400", 16, 51.2, 6, 130, 16), _c("Core i7-11700K", 32, 51.2, 8, 145, 16),
    _c("Core i7-1185G7", 16, 68, 4, 100, 16),
    _c("Ryzen 5 3600", 16, 51.2, 6, 115), _c("Ryzen 7 3700X", 32, 51.2, 8, 115),
    _c("Ryzen 9 3900X", 64, 51.2, 12, 115), _c("Ryzen 9 3950X", 64, 51.2, 16, 110),
    _c("Ryzen 5 5600G", 16, 51.2, 6, 125), _c("Ryzen 7 5700G", 32, 51.2, 8, 125),
    _c("Ryzen 7 5700X", 32, 51.2, 8, 125), _c("Ryzen 7 5800H", 16, 51.2, 8, 115),
    _c("Ryzen 7 6800H", 16, 76.8, 8, 120),
    # DESIGN.md's reference machine, given by its measured copy rate (22 GB/s)
    measured_cpu("Generic 2-core cloud VM (AVX2)", 24, 22, 116, 2),
)

_APPLE_BW = {
    "m1": (68, 8, 8), "m1 pro": (200, 16, 16), "m1 max": (400, 32, 32), "m1 ultra": (800, 64, 64),
    "m2": (100, 10, 8), "m2 pro": (200, 19, 16), "m2 max": (400, 38, 32), "m2 ultra": (800, 76, 64),
    "m3": (100, 10, 8), "m3 pro": (150, 18, 18), "m3 max": (400, 40, 36), "m3 ultra": (819, 80, 96),
    "m4": (120, 10, 16), "m4 pro": (273, 20, 24), "m4 max": (546, 40, 36),
    "m5": (153, 10, 16), "m5 pro": (307, 20, 24), "m5 max": (614, 40, 48),
}


# Binned variants with a narrower memory bus than the full chip (the llama.cpp Apple table's
# figures: M3 Max 30-core GPU 300 GB/s, M4 Max 32-core GPU 410 GB/s)
_APPLE_BINNED_BW = {("m3 max", 30): 300, ("m4 max", 32): 410}


def apple_chip(chip: str, gpu_cores: int | None = None, memory_gb: float | None = None) -> DeviceSpec:
    """Spec of an Apple chip ('M2 Max'); gpu_cores/memory override the catalog's default variant."""
    key = chip.lower().replace("apple", "").strip()
    bw, cores, mem = _APPLE_BW[key]
    cores = gpu_cores or cores
    bw = _APPLE_BINNED_BW.get((key, cores), bw)
    spec = _a(f"Apple {chip.strip()}", memory_gb or mem, bw, cores, _APPLE_TF[key.split()[0]])
    return replace(spec, dies=2) if key.endswith("ultra") else spec


def normalise_name(name: str) -> str:
    s = name.lower()
    s = re.sub(r"\(r\)|\(tm\)|nvidia|geforce|amd|intel|apple|graphics|\bcpu\b|@.*$", " ", s)
    return re.sub(r"[^a-z0-9./]+", " ", s).strip()


# Tokens that name a different part of the same family: a name must agree on them with a
# catalog entry, so an "RTX 4070 Ti" is not taken for the RTX 4070, an RX 7900 GRE (576 GB/s)
# for the XTX (960), or a laptop RTX 4090 (16 GB, 576 GB/s) for the desktop card.
_VARIANTS = frozenset({"ti", "super", "xt", "xtx", "gre", "laptop", "nvl", "sxm", "pcie", "nx",
                       "agx"})
_MEMORY_TOKEN = re.compile(r"^(\d{1,4})gb$")
# Names that tools print for a catalog entry without sharing its tokens (nvidia-smi, drivers),
# written without memory sizes and "gpu" ("NVIDIA H100 80GB HBM3" -> "h100 hbm3").
_ALIASES = {"h100": "H100 SXM", "h100 hbm3": "H100 SXM",
            "ryzen ai max 395": "Radeon 8060S (Ryzen AI Max+ 395)",
            "radeon 8060s": "Radeon 8060S (Ryzen AI Max+ 395)",
            "ryzen ai max 395 w/ radeon 8060s": "Radeon 8060S (Ryzen AI Max+ 395)",
            "strix halo": "Radeon 8060S (Ryzen AI Max+ 395)",
            "arc 140v": "Arc Graphics 130V/140V (integrated)",
            "arc 130v": "Arc Graphics 130V/140V (integrated)",
            "radeon 860m": "Radeon 840M / 860M Graphics",
            "radeon 840m": "Radeon 840M / 860M Graphics",
            # boards on Rockchip's RK3588 (4x A76 + 4x A55, 64-bit LPDDR4X/5)
            "orange pi 5": "Orange Pi 5 (RK3588)", "orange pi 5 plus": "Orange Pi 5 (RK3588)",
            "orange pi 5 pro": "Orange Pi 5 (RK3588)", "orange pi 5 max": "Orange Pi 5 (RK3588)",
            "rock 5b": "Orange Pi 5 (RK3588)", "radxa rock 5b": "Orange Pi 5 (RK3588)",
            "rk3588": "Orange Pi 5 (RK3588)"}


def _tokens(norm: str) -> list[str]:
    """Name tokens with a memory size joined to its unit ("16 gb" -> "16gb"), SXM4/SXM5 and
    PCIe generations read as the form factor, and "mobile" as "laptop"."""
    toks = re.sub(r"\b(\d{1,4}) gb\b", r"\1gb", norm).split()
    toks = [re.sub(r"^(sxm|pcie)\d*$", r"\1", t) for t in toks]
    # an Intel Core's F suffix (no integrated GPU: "10400F", "13900KF") is the same CPU
    toks = [re.sub(r"^(\d{4,5}k?)f$", r"\1", t) for t in toks]
    return ["laptop" if t == "mobile" else t for t in toks]


def _is_model_number(token: str) -> bool:
    """A token that names the part ("3070", "i9", "130v"), not a memory size ("16gb")."""
    return any(ch.isdigit() for ch in token) and not _MEMORY_TOKEN.match(token)


def _memory_of(tokens: list[str]) -> float | None:
    sizes = [float(m.group(1)) for t in tokens if (m := _MEMORY_TOKEN.match(t))]
    return sizes[-1] if sizes and 0 < sizes[-1] <= 4096 else None


def memory_in_name(name: str) -> float | None:
    """A memory size written in a device name ("RTX 4060 Ti 16GB", "M4 Max 128 GB"), in GiB."""
    return _memory_of(_tokens(normalise_name(name)))


def lookup(name: str) -> DeviceSpec | None:
    """Catalog entry for a device name, or None. Apple chips accept 'M3 Max' or 'Apple M3 Max'.
    A memory size in the name ("RTX 4060 Ti 16GB", "M4 Max 128GB") sets `memory_gb`."""
    tokens = _tokens(normalise_name(name))
    memory = _memory_of(tokens)
    unsized = [t for t in tokens if not _MEMORY_TOKEN.match(t)]
    alias = _ALIASES.get(" ".join(t for t in unsized if t != "gpu"))
    if alias:
        return _best_match(set(_tokens(normalise_name(alias))), memory)
    chip = " ".join(unsized)
    # "M3 Max", or as Apple lists a configuration: "M3 Max 16-core CPU 40-core GPU 128GB"
    apple = re.fullmatch(r"(m[1-5])(?: (pro|max|ultra))?((?: (?:\d+ core(?: cpu| gpu| neural engine)?"
                         r"|chip|with|and|unified|memory|ram))*)", chip)
    if apple:
        gpu = re.search(r"(\d+) core gpu", apple.group(3))
        return apple_chip(" ".join(p for p in apple.groups()[:2] if p).upper()
                          .replace("PRO", "Pro").replace("MAX", "Max").replace("ULTRA", "Ultra"),
                          gpu_cores=int(gpu.group(1)) if gpu else None, memory_gb=memory)
    return _best_match(set(tokens), memory)


# Words a vendor or a tool adds to a device's name that do not tell products apart.
_GENERIC_WORDS = frozenset({"nvidia", "geforce", "amd", "radeon", "intel", "apple", "gpu", "cpu",
                            "graphics", "integrated", "processor", "core", "with", "chip"})


def _own_words(name: set[str], other: set[str]) -> set[str]:
    """Words of `name` that `other` lacks and that tell products apart (not model numbers,
    memory sizes or vendors' generic words)."""
    return {t for t in name - other if not any(ch.isdigit() for ch in t)
            and t not in _GENERIC_WORDS}


def _best_match(want: set[str], memory: float | None = None) -> DeviceSpec | None:
    best, best_score = None, 0.0
    for spec, have in _CATALOG_TOKENS:
        if not have or not want:
            continue
        common = want & have
        # Every model-number token of the catalog name must be present ("3070" vs "3070 ti"),
        # and both names must agree on the variant ("ti", "super", "laptop", ...).
        numeric = {t for t in have if _is_model_number(t)}
        if not numeric <= want or not common or (want & _VARIANTS) != (have & _VARIANTS):
            continue
        # two products that share a model number, each named by a word of its own ("Orange Pi
        # 5" is not the "Raspberry Pi 5")
        if _own_words(want, have) and _own_words(have, want):
            continue
        score = len(common) / len(have | want)
        if score > best_score:
            best, best_score = spec, score
    if best is None or best_score < 0.34:
        return None
    return replace(best, memory_gb=memory) if memory is not None else best


def closest_names(name: str, n: int = 3) -> list[str]:
    """Catalog names that share the most tokens with `name` (for an error message)."""
    want = set(_tokens(normalise_name(name)))
    scored = [(sum(any(ch.isdigit() for ch in t) for t in want & have), len(want & have), spec.name)
              for spec, have in _CATALOG_TOKENS]
    ranked = sorted(scored, key=lambda t: (-t[0], -t[1]))
    return [nm for _, common, nm in ranked[:n] if common > 0]


# Each catalog name's tokens, once (lookup compares a name with every entry).
_CATALOG_TOKENS = tuple((spec, frozenset(_tokens(normalise_name(spec.name)))) for spec in CATALOG)


def with_overrides(spec: DeviceSpec, **fields: object) -> DeviceSpec:
    """A copy with the given non-None fields replaced. A bandwidth given by hand is a rated
    figure of the whole device: the copy rate a measured device carried, and what its threads
    gained over one thread's copy, no longer describe it."""
    given = {k: v for k, v in fields.items() if v is not None}
    if "bandwidth_gbps" in given and "copy_bandwidth_gbps" not in given:
        given["copy_bandwidth_gbps"] = None
        given.setdefault("threads_bandwidth_gain", 1.0)
    return replace(spec, **given)
