"""Peak numbers of the accelerators xpuprof knows, and matching of the names traces give them.

Every number is the vendor's own, from the datasheet or documentation page named in the
``source`` of its entry (and in the comment above it). Conventions:

* **FLOP/s are dense peaks.** NVIDIA datasheets print Tensor Core rates "with sparsity" (2:4
  structured sparsity doubles them) and mark them with an asterisk; the table holds half of those
  numbers, the rate a dense GEMM can reach. AMD and Google print dense rates.
* Keys of ``flops``: ``fp64`` and ``fp32`` are the vector (CUDA core / SIMD) rates;
  ``fp64_matrix`` and ``fp32_matrix`` the matrix-unit rates where the vendor gives a separate one
  (NVIDIA's FP64 Tensor Core, AMD's Matrix Cores); ``tf32``, ``bf16``, ``fp16``, ``fp8`` the
  Tensor/Matrix Core rates; ``int8`` in OP/s. A precision the datasheet does not list is absent,
  never guessed (:meth:`DeviceSpec.peak` says which fallback it used).
* ``memory_bandwidth`` is the peak DRAM (HBM/GDDR) bandwidth in bytes/s, ``memory_bytes`` the
  capacity (decimal GB as printed; a trace's ``totalGlobalMem`` replaces it when known).
* ``interconnect_bandwidth`` is the vendor's per-device figure for its scale-up link in bytes/s,
  both directions together, as printed (NVLink "900 GB/s", Infinity Fabric aggregate, ICI
  "bidirectional per chip"); PCIe-only cards give their PCIe x16 bidirectional figure.

One entry is one device as the runtime sees it: an MI250/MI250X package is two GCDs that ROCm
exposes as two devices, so ``match`` returns the ``-gcd`` entry (half the package) for a trace's
device, and the package entry only for a bare name.

Length: most of the module is the one table of datasheet entries, each with its source beside
it; split across files it would be harder to audit against the datasheets, not easier to read.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TERA = 1e12
GB = 1e9

#: Canonical precision names, most to least precise.
DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")


@dataclass(frozen=True)
class DeviceSpec:
    """Peak capabilities of one device (see the module docstring for units and conventions)."""

    key: str
    name: str
    vendor: str
    kind: str  # "gpu", "tpu" or "cpu"
    flops: Mapping[str, float]
    memory_bandwidth: float
    memory_bytes: float | None = None
    interconnect: str | None = None
    interconnect_bandwidth: float | None = None
    source: str = ""
    notes: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def peak(self, dtype: str = "fp32", *, matrix: bool = True) -> tuple[float | None, str | None]:
        """Peak rate for work in ``dtype`` and the key it came from (None, None if unknown).

        ``matrix=True`` is GEMM-like work (matmul, convolution, attention) that runs on Tensor /
        Matrix Cores / the MXU; ``matrix=False`` is everything else (elementwise, reductions),
        which runs on the vector units: measured against ``fp32`` (``fp64`` for doubles) — the
        datasheets give no separate vector rate for 16-bit types on most parts. Fallbacks, in
        order: fp32 matrix work on a part without ``fp32_matrix`` uses ``fp32`` (PyTorch runs
        fp32 matmuls in full precision unless TF32 is allowed); TPUs run fp32 matmuls as bf16
        passes on the MXU at XLA's default precision, so a TPU's fp32 is its ``bf16``; a
        16-bit type a part lacks uses the other 16-bit type, then ``fp32``.
        """
        f = self.flops
        d = dtype if dtype in DTYPES else "fp32"
        if not matrix and self.kind != "tpu":
            key = "fp64" if d == "fp64" else "fp32"
            return (f[key], key) if key in f else (None, None)
        if self.kind == "tpu" and d in ("fp32", "tf32", "fp64"):
            d = "bf16"
        chain = {
            "fp64": ("fp64_matrix", "fp64"),
            "fp32": ("fp32_matrix", "fp32"),
            "tf32": ("tf32", "fp32_matrix", "fp32"),
            "bf16": ("bf16", "fp16", "fp32_matrix", "fp32"),
            "fp16": ("fp16", "bf16", "fp32_matrix", "fp32"),
            "fp8": ("fp8", "fp16", "bf16"),
            "int8": ("int8",),
        }[d]
        for key in chain:
            if key in f:
                return f[key], key
        return None, None

    def ridge(self, dtype: str = "fp32", *, matrix: bool = True) -> float | None:
        """Arithmetic intensity (FLOP/byte) where the compute roof meets the memory roof."""
        p, _ = self.peak(dtype, matrix=matrix)
        return p / self.memory_bandwidth if p and self.memory_bandwidth else None

    def with_memory(self, nbytes: float | None) -> DeviceSpec:
        """This spec with the capacity a trace reports for the device."""
        if not nbytes:
            return self
        return dataclasses.replace(self, memory_bytes=float(nbytes))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["flops"] = dict(self.flops)
        d["extra"] = dict(self.extra)
        return d


def _spec(key: str, name: str, vendor: str, kind: str, *, tflops: dict[str, float],
          bw_gbs: float, mem_gb: float | None, link: str | None, link_gbs: float | None,
          source: str, notes: str = "") -> DeviceSpec:  # fmt: skip
    return DeviceSpec(
        key=key,
        name=name,
        vendor=vendor,
        kind=kind,
        flops={k: v * TERA for k, v in tflops.items()},
        memory_bandwidth=bw_gbs * GB,
        memory_bytes=None if mem_gb is None else mem_gb * GB,
        interconnect=link,
        interconnect_bandwidth=None if link_gbs is None else link_gbs * GB,
        source=source,
        notes=notes,
    )


def _half(spec: DeviceSpec, key: str, name: str) -> DeviceSpec:
    """One GCD of a two-die AMD package: half its rates, memory and bandwidth."""
    return dataclasses.replace(
        spec,
        key=key,
        name=name,
        flops={k: v / 2 for k, v in spec.flops.items()},
        memory_bandwidth=spec.memory_bandwidth / 2,
        memory_bytes=None if spec.memory_bytes is None else spec.memory_bytes / 2,
        interconnect_bandwidth=(
            None if spec.interconnect_bandwidth is None else spec.interconnect_bandwidth / 2
        ),
        notes=(spec.notes + " " if spec.notes else "")
        + "One GCD (graphics compute die) = half of the package; ROCm shows each GCD as a device.",
    )


# --- NVIDIA ---------------------------------------------------------------------------------
# Tesla V100 datasheet ("NVIDIA Tesla V100 GPU Accelerator", volta-v100-datasheet-update-us-
# 1165301-r5): SXM2 7.8 / 15.7 / 125 (Tensor) TFLOPS, PCIe 7 / 14 / 112, V100S PCIe 8.2 / 16.4 /
# 130; HBM2 900 GB/s (V100S 1134 GB/s), 32 or 16 GB; NVLink 300 GB/s (SXM2), PCIe Gen3 32 GB/s.
_V100 = "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"  # noqa: E501
# A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web): FP64 9.7, FP64 Tensor Core
# 19.5, FP32 19.5, TF32 156 (312*), BF16/FP16 312 (624*), INT8 624 TOPS (1248*); 40GB HBM2
# 1,555 GB/s; 80GB PCIe 1,935 GB/s; 80GB SXM 2,039 GB/s; NVLink 600 GB/s; PCIe Gen4 64 GB/s.
_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"  # noqa: E501
# H100 datasheet (h100-datasheet-2430615): SXM FP64 34, FP64 TC 67, FP32 67, TF32 989*, BF16/FP16
# 1,979*, FP8/INT8 3,958*; 80GB 3.35 TB/s; NVLink 900 GB/s. PCIe 26 / 51 / 51 / 756* / 1,513* /
# 3,026*; 80GB 2 TB/s; NVLink bridge 600 GB/s, PCIe Gen5 128 GB/s. NVL 30 / 60 / 60 / 835* /
# 1,671* / 3,341*; 94GB 3.9 TB/s; NVLink 600 GB/s. (* = with sparsity: the table holds half.)
_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
# H200 datasheet / product page (nvidia.com/en-us/data-center/h200): SXM FP64 34, FP64 TC 67,
# FP32 67, TF32 989*, BF16/FP16 1,979*, FP8/INT8 3,958*; 141GB HBM3e 4.8 TB/s; NVLink 900 GB/s.
# NVL: 30 / 60 / 60 / 835* / 1,671* / 3,341*; 141GB 4.8 TB/s; 2- or 4-way NVLink bridge 900 GB/s.
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
# HGX B200 (NVIDIA Blackwell datasheet, "HGX B200" column, per GPU): FP64/FP64 TC 40, FP32 80,
# TF32 2.2 PF*, BF16/FP16 4.5 PF*, FP8 9 PF*, INT8 9 POPS*; DGX B200 datasheet: 1,440 GB HBM3e
# and 64 TB/s for 8 GPUs (180 GB, 8 TB/s each); NVLink 5: 1.8 TB/s per GPU.
_B200 = "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200); DGX B200 datasheet"
# NVIDIA L4 datasheet (nvidia-l4-datasheet-2287957): FP32 30.3, TF32 120*, BF16/FP16 242*,
# FP8 485*, INT8 485* TOPS; 24GB GDDR6 300 GB/s; PCIe Gen4 x16 64 GB/s. No FP64 rate printed.
_L4 = "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet"
# NVIDIA T4 datasheet (t4-tensor-core-datasheet-951643): FP32 8.1, mixed FP16/FP32 65,
# INT8 130 TOPS; 16GB GDDR6 320+ GB/s; PCIe Gen3 x16 32 GB/s. No FP64 rate printed.
_T4 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"  # noqa: E501

_A100_FLOPS = {"fp64": 9.7, "fp64_matrix": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0,
               "fp16": 312.0, "int8": 624.0}  # fmt: skip
_H100_SXM_FLOPS = {"fp64": 34.0, "fp64_matrix": 67.0, "fp32": 67.0, "tf32": 494.5,
                   "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0, "int8": 1979.0}  # fmt: skip
_H100_PCIE_FLOPS = {"fp64": 26.0, "fp64_matrix": 51.0, "fp32": 51.0, "tf32": 378.0,
                    "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0, "int8": 1513.0}  # fmt: skip
_NVL_FLOPS = {"fp64": 30.0, "fp64_matrix": 60.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5,
              "fp16": 835.5, "fp8": 1670.5, "int8": 1670.5}  # fmt: skip

_NVIDIA: list[DeviceSpec] = [
    _spec(
        "v100-sxm2",
        "NVIDIA V100 SXM2",
        "NVIDIA",
        "gpu",
        tflops={"fp64": 7.8, "fp32": 15.7, "fp16": 125.0},
        bw_gbs=900,
        mem_gb=32,
        link="NVLink 2",
        link_gbs=300,
        source=_V100,
        notes="Also the DGXS and SXM3 variants (same GV100, close clocks); 16 GB or 32 GB.",
    ),
    _spec(
        "v100-pcie",
        "NVIDIA V100 PCIe",
        "NVIDIA",
        "gpu",
        tflops={"fp64": 7.0, "fp32": 14.0, "fp16": 112.0},
        bw_gbs=900,
        mem_gb=32,
        link="PCIe Gen3 x16",
        link_gbs=32,
        source=_V100,
    ),
    _spec(
        "v100s-pcie",
        "NVIDIA V100S PCIe",
        "NVIDIA",
        "gpu",
        tflops={"fp64": 8.2, "fp32": 16.4, "fp16": 130.0},
        bw_gbs=1134,
        mem_gb=32,
        link="PCIe Gen3 x16",
        link_gbs=32,
        source=_V100,
    ),
    _spec(
        "a100-sxm4-40gb",
        "NVIDIA A100 SXM4 40GB",
        "NVIDIA",
        "gpu",
        tflops=_A100_FLOPS,
        bw_gbs=1555,
        mem_gb=40,
        link="NVLink 3",
        link_gbs=600,
        source=_A100,
    ),
    _spec(
        "a100-sxm4-80gb",
        "NVIDIA A100 SXM4 80GB",
        "NVIDIA",
        "gpu",
        tflops=_A100_FLOPS,
        bw_gbs=2039,
        mem_gb=80,
        link="NVLink 3",
        link_gbs=600,
        source=_A100,
    ),
    _spec(
        "a100-pcie-40gb",
        "NVIDIA A100 PCIe 40GB",
        "NVIDIA",
        "gpu",
        tflops=_A100_FLOPS,
        bw_gbs=1555,
        mem_gb=40,
        link="PCIe Gen4 x16",
        link_gbs=64,
        source=_A100,
        notes="An NVLink bridge joins two PCIe cards at 600 GB/s.",
    ),
    _spec(
        "a100-pcie-80gb",
        "NVIDIA A100 PCIe 80GB",
        "NVIDIA",
        "gpu",
        tflops=_A100_FLOPS,
        bw_gbs=1935,
        mem_gb=80,
        link="PCIe Gen4 x16",
        link_gbs=64,
        source=_A100,
        notes="An NVLink bridge joins two PCIe cards at 600 GB/s.",
    ),
    _spec(
        "h100-sxm",
        "NVIDIA H100 SXM5",
        "NVIDIA",
        "gpu",
        tflops=_H100_SXM_FLOPS,
        bw_gbs=3350,
        mem_gb=80,
        link="NVLink 4",
        link_gbs=900,
        source=_H100,
    ),
    _spec(
        "h100-pcie",
        "NVIDIA H100 PCIe",
        "NVIDIA",
        "gpu",
        tflops=_H100_PCIE_FLOPS,
        bw_gbs=2000,
        mem_gb=80,
        link="PCIe Gen5 x16",
        link_gbs=128,
        source=_H100,
        notes="An NVLink bridge joins two PCIe cards at 600 GB/s.",
    ),
    _spec(
        "h100-nvl",
        "NVIDIA H100 NVL",
        "NVIDIA",
        "gpu",
        tflops=_NVL_FLOPS,
        bw_gbs=3900,
        mem_gb=94,
        link="NVLink 4 bridge",
        link_gbs=600,
        source=_H100,
    ),
    _spec(
        "h200-sxm",
        "NVIDIA H200 SXM",
        "NVIDIA",
        "gpu",
        tflops=_H100_SXM_FLOPS,
        bw_gbs=4800,
        mem_gb=141,
        link="NVLink 4",
        link_gbs=900,
        source=_H200,
    ),
    _spec(
        "h200-nvl",
        "NVIDIA H200 NVL",
        "NVIDIA",
        "gpu",
        tflops=_NVL_FLOPS,
        bw_gbs=4800,
        mem_gb=141,
        link="NVLink 4 bridge",
        link_gbs=900,
        source=_H200,
    ),
    _spec(
        "b200",
        "NVIDIA B200 (HGX)",
        "NVIDIA",
        "gpu",
        tflops={
            "fp64": 40.0,
            "fp64_matrix": 40.0,
            "fp32": 80.0,
            "tf32": 1100.0,
            "bf16": 2250.0,
            "fp16": 2250.0,
            "fp8": 4500.0,
            "int8": 4500.0,
        },
        bw_gbs=8000,
        mem_gb=180,
        link="NVLink 5",
        link_gbs=1800,
        source=_B200,
        notes="HGX B200 at 1,000 W; GB200 parts run higher clocks.",
    ),
    _spec(
        "l4",
        "NVIDIA L4",
        "NVIDIA",
        "gpu",
        tflops={
            "fp32": 30.3,
            "tf32": 60.0,
            "bf16": 121.0,
            "fp16": 121.0,
            "fp8": 242.5,
            "int8": 242.5,
        },
        bw_gbs=300,
        mem_gb=24,
        link="PCIe Gen4 x16",
        link_gbs=64,
        source=_L4,
    ),
    _spec(
        "t4",
        "NVIDIA T4",
        "NVIDIA",
        "gpu",
        tflops={"fp32": 8.1, "fp16": 65.0, "int8": 130.0},
        bw_gbs=320,
        mem_gb=16,
        link="PCIe Gen3 x16",
        link_gbs=32,
        source=_T4,
        notes="fp16 is the mixed FP16/FP32 Tensor Core rate.",
    ),
]

# --- AMD ------------------------------------------------------------------------------------
# AMD Instinct MI250X / MI250 product pages and brochure (amd.com/en/products/accelerators/
# instinct/mi200): MI250X 220 CUs, FP64/FP32 vector 47.9, FP64/FP32 matrix 95.7, FP16/BF16 383,
# INT8 383 TOPS, 128 GB HBM2e 3.2 TB/s, 8 Infinity Fabric links (100 GB/s each); MI250 208 CUs,
# 45.3 / 90.5 / 362.1 / 362.1, 128 GB 3.2 TB/s, 6 links.
_MI200 = "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html; .../mi250.html"
# AMD Instinct MI300X data sheet (amd-instinct-mi300x-data-sheet): 304 CUs, FP64 vector 81.7,
# FP64 matrix 163.4, FP32 vector/matrix 163.4, TF32 653.7, FP16/BF16 1,307.4, FP8 2,614.9,
# INT8 2,614.9 TOPS (dense; sparsity doubles the last four); 192 GB HBM3 5.3 TB/s; Infinity
# Fabric 7 links x 128 GB/s = 896 GB/s peak aggregate.
_MI300X = "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf"  # noqa: E501

_MI250X = _spec("mi250x", "AMD Instinct MI250X (package, 2 GCDs)", "AMD", "gpu",
                tflops={"fp64": 47.9, "fp64_matrix": 95.7, "fp32": 47.9, "fp32_matrix": 95.7,
                        "bf16": 383.0, "fp16": 383.0, "int8": 383.0},
                bw_gbs=3200, mem_gb=128, link="Infinity Fabric (8 links)", link_gbs=800,
                source=_MI200)  # fmt: skip
_MI250 = _spec("mi250", "AMD Instinct MI250 (package, 2 GCDs)", "AMD", "gpu",
               tflops={"fp64": 45.3, "fp64_matrix": 90.5, "fp32": 45.3, "fp32_matrix": 90.5,
                       "bf16": 362.1, "fp16": 362.1, "int8": 362.1},
               bw_gbs=3200, mem_gb=128, link="Infinity Fabric (6 links)", link_gbs=600,
               source=_MI200)  # fmt: skip
_AMD: list[DeviceSpec] = [
    _MI250X,
    _half(_MI250X, "mi250x-gcd", "AMD Instinct MI250X (one GCD)"),
    _MI250,
    _half(_MI250, "mi250-gcd", "AMD Instinct MI250 (one GCD)"),
    _spec(
        "mi300x",
        "AMD Instinct MI300X",
        "AMD",
        "gpu",
        tflops={
            "fp64": 81.7,
            "fp64_matrix": 163.4,
            "fp32": 163.4,
            "fp32_matrix": 163.4,
            "tf32": 653.7,
            "bf16": 1307.4,
            "fp16": 1307.4,
            "fp8": 2614.9,
            "int8": 2614.9,
        },
        bw_gbs=5300,
        mem_gb=192,
        link="Infinity Fabric (7 links)",
        link_gbs=896,
        source=_MI300X,
    ),
]

# --- Google TPU -----------------------------------------------------------------------------
# Cloud TPU system architecture pages (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e), per chip:
# v4 275 TFLOPs bf16 or int8, 32 GiB HBM2 1,200 GBps; v5e 197 bf16, 394 int8, 16 GB 819 GBps,
# ICI 400 GBps bidirectional; v5p 459 bf16, 918 int8 (459 fp8), 95 GB 2,765 GBps, ICI 1,200
# GBps bidirectional; v6e 918 bf16, 1,836 int8, 32 GB 1,640 GBps (XPlane reports 1,638),
# ICI 800 GBps bidirectional. v4's page gives no per-chip ICI figure: 6 links (3D torus) x
# 45 GB/s per direction (jax-ml "How to Scale Your Model", part 2, TPU table) = 540 GB/s.
_TPU = "https://cloud.google.com/tpu/docs/"
_GOOGLE: list[DeviceSpec] = [
    _spec(
        "tpu-v4",
        "Google TPU v4",
        "Google",
        "tpu",
        tflops={"bf16": 275.0, "int8": 275.0},
        bw_gbs=1200,
        mem_gb=32 * 1.073741824,
        link="ICI (3D torus, 6 links)",
        link_gbs=540,
        source=_TPU + "v4",
        notes="ICI figure derived (6 links x 2 x 45 GB/s), not printed on the v4 page.",
    ),
    _spec(
        "tpu-v5e",
        "Google TPU v5e",
        "Google",
        "tpu",
        tflops={"bf16": 197.0, "int8": 394.0},
        bw_gbs=819,
        mem_gb=16,
        link="ICI (2D torus, 4 ports)",
        link_gbs=400,
        source=_TPU + "v5e",
    ),
    _spec(
        "tpu-v5p",
        "Google TPU v5p",
        "Google",
        "tpu",
        tflops={"bf16": 459.0, "fp8": 459.0, "int8": 918.0},
        bw_gbs=2765,
        mem_gb=95,
        link="ICI (3D torus)",
        link_gbs=1200,
        source=_TPU + "v5p",
    ),
    _spec(
        "tpu-v6e",
        "Google TPU v6e (Trillium)",
        "Google",
        "tpu",
        tflops={"bf16": 918.0, "int8": 1836.0},
        bw_gbs=1640,
        mem_gb=32,
        link="ICI (2D torus, 4 ports)",
        link_gbs=800,
        source=_TPU + "v6e",
    ),
]

#: Every known device, by key.
SPECS: dict[str, DeviceSpec] = {s.key: s for s in (*_NVIDIA, *_AMD, *_GOOGLE)}


def get(key: str) -> DeviceSpec:
    """The spec with this key (``"a100-sxm4-80gb"``), or a KeyError listing the keys."""
    try:
        return SPECS[key]
    except KeyError:
        raise KeyError(f"unknown device {key!r}; known: {', '.join(SPECS)}") from None


def _gb(props: Mapping[str, Any] | None) -> float | None:
    v = (props or {}).get("totalGlobalMem")
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def _amd_from_props(props: Mapping[str, Any]) -> str | None:
    """A ROCm device that calls itself "AMD Radeon Graphics": known by its CU count."""
    arch = str(props.get("gcnArchName", "")).lower()
    cus = props.get("numSms") or props.get("multiProcessorCount")
    if arch.startswith("gfx942") or cus in (304,):
        return "mi300x"
    if arch.startswith("gfx90a") or (props.get("computeMajor") == 9 and cus in (104, 110)):
        return {104: "mi250-gcd", 110: "mi250x-gcd"}.get(cus)  # type: ignore[arg-type]
    return None


def match(name: str | None, props: Mapping[str, Any] | None = None) -> DeviceSpec | None:
    """The spec of a device named as a trace names it, or None when it is not in the table.

    Accepts Kineto ``deviceProperties`` names (``"NVIDIA A100-SXM4-80GB"``, ``"Tesla
    V100-SXM2-32GB"``, ``"NVIDIA H200"``, ``"NVIDIA A100-PG509-200"``), ROCm names (``"AMD Instinct
    MI250X"``; the generic ``"AMD Radeon Graphics"`` is resolved from ``props``' CU count), XPlane
    ``device_type_string`` values (``"TPU v6 Lite"``, ``"TPU v5"``, ``"TPU v4"``), JAX
    ``device_kind`` strings and the table's own keys. ``props`` (one ``deviceProperties``
    entry) settles 40 vs 80 GB and supplies the capacity the device reports.
    """
    if not name:
        if props and _amd_from_props(props):
            return SPECS[_amd_from_props(props)].with_memory(_gb(props))  # type: ignore[index]
        return None
    raw = str(name).strip()
    if raw.lower() in SPECS:
        return SPECS[raw.lower()]
    s = raw.lower()
    n = re.sub(r"[\s_\-]+", " ", s)
    mem = _gb(props)

    def pick(key: str) -> DeviceSpec:
        return SPECS[key].with_memory(mem)

    # Google TPUs: XPlane "TPU v6 Lite", JAX "TPU v5 lite", "TPU v5p", "TPU v4", "TPU v6e".
    m = re.search(r"\btpu\s*v?(\d+)\s*([a-z]*)", n)
    if m:
        gen, suffix = m.group(1), m.group(2)
        lite = suffix in ("e", "lite") or " lite" in n
        if gen == "4" and not lite:
            return pick("tpu-v4")
        if gen == "5":
            return pick("tpu-v5e" if lite else "tpu-v5p")
        if gen == "6" and (lite or suffix == ""):
            return pick("tpu-v6e")
        return None
    # AMD
    if "mi300x" in n:
        return pick("mi300x")
    for part in ("mi250x", "mi250"):
        if part in n.replace(" ", ""):
            gcd = props is not None and (
                (props.get("numSms") in (104, 110)) or (mem is not None and mem < 100e9)
            )
            return pick(part + "-gcd" if gcd else part)
    if ("radeon" in n or n.startswith("amd")) and props:
        key = _amd_from_props(props)
        return pick(key) if key else None
    # NVIDIA
    if re.search(r"\bg?b200\b", n):
        return pick("b200")
    if "h200" in n:
        return pick("h200-nvl" if "nvl" in n else "h200-sxm")
    if "h100" in n:
        if "nvl" in n:
            return pick("h100-nvl")
        return pick("h100-pcie" if "pcie" in n else "h100-sxm")
    if "a100" in n:
        big = "80gb" in n.replace(" ", "") or (mem is not None and mem > 60e9)
        form = "pcie" if "pcie" in n else "sxm4"  # PG509 (Meta/OEM boards) is the SXM4 module
        return pick(f"a100-{form}-{'80gb' if big else '40gb'}")
    if "v100s" in n:
        return pick("v100s-pcie")
    if "v100" in n:
        return pick("v100-pcie" if "pcie" in n else "v100-sxm2")
    if re.search(r"\bl4\b", n):
        return pick("l4")
    if re.search(r"\bt4\b", n):
        return pick("t4")
    return None


def table() -> list[dict[str, Any]]:
    """The whole table as records (for ``xpuprof hardware`` and reports): one row per device,
    rates in TFLOP/s, bandwidths in GB/s, capacity in GB."""
    rows = []
    for s in SPECS.values():
        row: dict[str, Any] = {"key": s.key, "name": s.name, "vendor": s.vendor, "kind": s.kind}
        for k in ("fp64", "fp64_matrix", "fp32", "fp32_matrix", "tf32", "bf16", "fp16", "fp8",
                  "int8"):  # fmt: skip
            row[f"{k}_tflops"] = s.flops[k] / TERA if k in s.flops else None
        row["memory_gbs"] = s.memory_bandwidth / GB
        row["memory_gb"] = None if s.memory_bytes is None else s.memory_bytes / GB
        row["interconnect"] = s.interconnect
        row["interconnect_gbs"] = (
            None if s.interconnect_bandwidth is None else s.interconnect_bandwidth / GB
        )
        row["source"] = s.source
        rows.append(row)
    return rows
