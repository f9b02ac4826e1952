"""The accelerator chips this package knows: memory, peak dense bfloat16 FLOP/s and HBM bandwidth
per chip and, where published, the vector units' rates, with their sources, in one table
(`CHIPS`) that compiling for absent chips (`minilm_jax.aot`), the benchmarks' utilisation
(`timing.peak_flops`) and the kernels' bounds (`bench kernels`) read."""

import dataclasses

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class VectorRates:
  """What a chip's vector units do besides its matrix products, per core (a GPU's streaming
  multiprocessor) and clock: exponentials on the transcendental units, 32-bit integer
  instructions, and instructions issued of any kind (each a lane's)."""

  clock_hz: float
  cores: int
  transcendentals: int
  integer_ops: int
  issued: int
  source: str

  def per_second(self, per_core_clock: int) -> float:
    return per_core_clock * self.cores * self.clock_hz


# GH100 (H100 SXM5 and H200): 132 SMs at up to 1.98 GHz (the compiler's target description);
# per SM and clock, compute capability 9.0 in the CUDA C++ Programming Guide's table of arithmetic
# instruction throughput: 16 exp2 (and the other transcendentals), 64 32-bit integer adds,
# multiplies, shifts, compares and logic operations, and 4 warp schedulers issuing a warp's
# instruction each (128 lanes).
GH100_VECTOR = VectorRates(
  1.98e9,
  132,
  16,
  64,
  128,
  "CUDA C++ Programming Guide, arithmetic instruction throughput, compute capability 9.0; 132 SMs at 1.98 GHz",
)


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip as JAX sees it (one device per chip: v4 and v5p run as megacore), and how
  targets of it are named: a TPU slice `<name>-<count>[x<slices>]`, counting chips or TensorCores
  (`cores_per_chip`); GPU hosts `<name>x<gpus per host>[x<hosts>]`. A row of `CHIPS` is all a new
  chip of a known platform needs: `aot`'s `parse_target`, `examples` and help, and the benchmarks'
  utilisation (`timing.peak_flops`), read the table."""

  platform: str  # "tpu" or "cuda"
  topology_prefix: str  # libtpu's generation name in topology strings ("v5e:2x2"); GPUs: unused
  memory_bytes: int  # high-bandwidth memory per chip
  peak_bf16_flops: float  # dense bfloat16 FLOP/s per chip
  hbm_bytes_per_s: float  # HBM bandwidth per chip
  source: str  # where the three numbers come from
  examples: tuple  # target names listed in aot's help and in errors
  grid: int = 2  # TPU slices: 2-D (v5e, v6e) or 3-D (v4, v5p) chip grids (`aot.targets`' slice shapes)
  cores_per_chip: int = 1  # TPU names count TensorCores: 2 on v4 and v5p (one megacore device per chip)
  gpus_per_host: int = 8  # GPU hosts: at most this many per host
  target_config: str = ""  # GPUs: the chip as XLA's GPU compiler describes it (GpuTargetConfigProto text)
  device_kinds: tuple = ()  # how JAX names a device of the chip (the start of `device_kind`), for timings
  vector: VectorRates | None = None  # None where no rates are published (the TPUs' VPU and EUP)


# An H100 SXM5 as XLA's GPU compiler describes it (its GpuTargetConfigProto; XLA keeps the full
# spec as xla/backends/gpu/target_config/specs/h100_sxm.txtpb). The compiler reads the compute
# capability, the cores, shared memory and the cuDNN/CUDA versions it may use from it.
H100_TARGET_CONFIG = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 85520809984
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 8 }
runtime_version { major: 12 minor: 8 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""

_TPU_DOCS = "cloud.google.com/tpu/docs/"
CHIPS = {
  "v4": Chip(
    "tpu",
    "v4",
    32 * GiB,
    275e12,
    1200e9,
    _TPU_DOCS + "v4: 32 GiB HBM2, 275 TFLOP/s bf16, 1,200 GB/s per chip",
    ("v4-8",),
    grid=3,
    device_kinds=("TPU v4",),
    cores_per_chip=2,
  ),
  "v5p": Chip(
    "tpu",
    "v5",
    95 * GiB,
    459e12,
    2765e9,
    _TPU_DOCS + "v5p: 95 GiB HBM2e, 459 TFLOP/s bf16, 2,765 GB/s per chip",
    ("v5p-8",),
    grid=3,
    device_kinds=("TPU v5p", "TPU v5"),
    cores_per_chip=2,
  ),
  "v5e": Chip(
    "tpu",
    "v5e",
    16 * GiB,
    197e12,
    819e9,
    _TPU_DOCS + "v5e: 16 GiB HBM2, 197 TFLOP/s bf16, 819 GB/s per chip",
    ("v5e-8", "v5e-256", "v5e-256x2"),
    device_kinds=("TPU v5 lite", "TPU v5e"),
  ),
  "v6e": Chip(
    "tpu",
    "v6e",
    32 * GiB,
    918e12,
    1640e9,
    _TPU_DOCS + "v6e: 32 GiB HBM, 918 TFLOP/s bf16, 1,640 GB/s per chip",
    ("v6e-8",),
    device_kinds=("TPU v6 lite", "TPU v6e"),
  ),
  # 81,559 MiB is what CUDA reports for the 80 GB part; 989 TFLOP/s is the datasheet's dense bf16,
  # 3.35 TB/s its HBM3 bandwidth (the target description says the same to the compiler).
  "h100": Chip(
    "cuda",
    "",
    81559 << 20,
    989.4e12,
    3.35e12,
    "NVIDIA H100 SXM5 datasheet: 80 GB HBM3, 989 TFLOP/s dense bf16, 3.35 TB/s",
    ("h100x1", "h100x8", "h100x8x2"),
    device_kinds=("NVIDIA H100",),
    target_config=H100_TARGET_CONFIG,
    vector=GH100_VECTOR,
  ),
  # The H100's GH100 chip with more and faster HBM: the same SMs, clock and dense bf16 peak.
  "h200": Chip(
    "cuda",
    "",
    143771 << 20,
    989.4e12,
    4.8e12,
    "NVIDIA H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s; the GH100's 989 TFLOP/s dense bf16",
    ("h200x1", "h200x8"),
    device_kinds=("NVIDIA H200",),
    target_config=H100_TARGET_CONFIG.replace("device_memory_size: 85520809984", f"device_memory_size: {143771 << 20}")
    .replace("memory_bandwidth: 3352320000000", "memory_bandwidth: 4800000000000")
    .replace("NVIDIA H100 80GB HBM3", "NVIDIA H200"),
    vector=GH100_VECTOR,
  ),
}
