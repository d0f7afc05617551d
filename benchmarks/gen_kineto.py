"""Deterministic generator of realistic PyTorch Kineto (Chrome-trace JSON) trace sets.

Why: the import benchmark of issue 2 needs a large multi-rank input (>= 8 ranks, >= 1.5 M events,
>= 300 MB) whose structure is what `torch.profiler` really writes, so that the xpuprof importer
and HTA are timed on the same, representative work. The real traces in ../shared/traces are far
too small and must not be copied, so this script re-creates their *structure* (studied in
`kineto/gpu/a100_rank0of2_nccl`, `v100_ns_resolution`, `v100_rank1of2_df_index_resolver`,
`a100_alexnet_cuda_sync`, `mi250_rocm_minitoy`) with synthetic content:

- the pretty-printed layout Kineto writes (`"ph": "X", "cat": ..., "name": ..., "pid": ..., "tid":`
  on one line, `"ts"`/`"dur"` on the next, args on one line with Kineto's odd spacing);
- the file order Kineto uses: one block per CPU thread (cpu_op, user_annotation, fwdbwd flows and
  `[memory]` instants, sorted by ts, parents first), then the activity block (each runtime call in
  time order, every GPU activity written just before the runtime call that launched it, with its
  ac2g flow), then the gpu_user_annotation ranges, then the "M" metadata block and the
  "Spans"/"Traces" string-pid events;
- float timestamps in microseconds with three decimals carrying nanoseconds;
- a training step of a 24-layer transformer under DDP: `ProfilerStep#N` spans, nested cpu_ops
  with `Input Dims`/`Input type`, a backward pass on the autograd thread linked by fwdbwd flows,
  `cudaLaunchKernel`/`cudaMemcpyAsync`/`cudaMemsetAsync` with correlation ids, kernels with
  launch statistics, NCCL all-reduces (`record_param_comms` + `ncclDevKernel_*` with collective
  args), `[memory]` allocation events and `cuda_sync` events.

Kineto quirk kept on purpose (it is in every real trace above): each runtime call that launches
nothing still gets a lone ac2g `f` flow (bp "e") with its own correlation id and no `s`. Disable
with `--no-orphan-flows`.

Timestamps: by default `ts` is absolute Unix time in microseconds (like v100_ns_resolution) and
`baseTimeNanoseconds` is 0, so that `ts * 1000 + baseTimeNanoseconds` is Unix ns as HTA computes
it. `--ts-origin base` writes ts relative to a non-zero `baseTimeNanoseconds` as Kineto >= 2.4 does.

Usage:
    python benchmarks/gen_kineto.py OUTDIR [--ranks 8] [--events 1600000] [--gzip]
    python benchmarks/gen_kineto.py OUTDIR --single-file-mb 2048

Writes OUTDIR/rank{r}.pt.trace.json[.gz] and a sidecar OUTDIR.gen.json (outside OUTDIR so that
tools which read every *.json in OUTDIR do not pick it up) with per-file sizes and counts per
(ph, cat). Output depends only on the arguments and --seed, not on --jobs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

# ---------------------------------------------------------------- constants of the modelled job

NUM_SMS = 108  # A100
DEVICE_NAME = "NVIDIA A100-SXM4-80GB"
COMPUTE_STREAM = 7
NCCL_STREAM = 20
LAYERS = 24
HIDDEN = 1024
HEADS = 16
FFN = 4 * HIDDEN
VOCAB = 32000
BATCH, SEQ = 1, 1024
TOKENS = BATCH * SEQ
DDP_BUCKET_BYTES = 25 * 1024 * 1024
GEMM_FLOPS = 95e12  # achieved TF32 throughput used to size GEMM kernels
HBM_BPS = 1.3e12  # achieved bandwidth used to size memory-bound kernels
EPOCH_NS = 1_712_195_495_000_000_000  # 2024-04-04, like v100_ns_resolution

CBID = {
    "cudaLaunchKernel": 211,
    "cudaLaunchKernelExC": 430,
    "cudaMemcpyAsync": 41,
    "cudaMemsetAsync": 51,
    "cudaStreamSynchronize": 131,
    "cudaEventRecord": 135,
    "cudaEventQuery": 138,
    "cudaStreamWaitEvent": 147,
    "cudaStreamIsCapturing": 317,
    "cudaStreamGetPriority": 203,
    "cudaDeviceGetStreamPriorityRange": 205,
    "cudaStreamGetCaptureInfo_v2": 409,
    "cudaFuncSetAttribute": 240,
    "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags": 285,
}

# Kernel catalogue: name -> (registers per thread, shared memory, block size)
_VEC = "void at::native::vectorized_elementwise_kernel<4, "
K = {
    "gemm_tn": (
        "sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4_warpsize2x2x1_"
        "tensor16x8x8_execute_kernel__5x_cublas",
        222, 81920, 256,
    ),
    "gemm_nn": (
        "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4_warpsize2x2x1_"
        "tensor16x8x8_execute_kernel__5x_cublas",
        222, 81920, 256,
    ),
    "gemm_nt": (
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_16x4_nt_align4>"
        "(cutlass_80_tensorop_s1688gemm_128x128_16x4_nt_align4::Params)",
        254, 65536, 128,
    ),
    "ln_fwd": (
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>"
        "(int, float, float const*, float const*, float const*, float*, float*, float*)",
        40, 0, 512,
    ),
    "ln_bwd_in": (
        "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized"
        "<float, float>(float const*, float const*, float const*, float const*, float const*, "
        "float*, int)",
        32, 0, 512,
    ),
    "ln_bwd_gb": (
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>"
        "(long, long, float const*, float const*, float const*, float const*, float*, float*)",
        64, 16384, 1024,
    ),
    "attn_fwd": (
        "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel"
        "<float, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
        128, 49152, 128,
    ),
    "attn_bwd": (
        "fmha_cutlassB_f32_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel"
        "<cutlass::arch::Sm80, float, true, false, true, 64, 64, 64, false>::Params)",
        255, 90112, 128,
    ),
    "gelu": (
        _VEC + "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::"
        "{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, "
        "at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase"
        "&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() "
        "const::{lambda(float)#1}, at::detail::Array<char*, 2>)",
        26, 0, 128,
    ),
    "gelu_bwd": (
        _VEC + "at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::"
        "GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::"
        "{lambda(float, float)#1}, at::detail::Array<char*, 3> >(int, at::native::"
        "GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}"
        "::operator()() const::{lambda()#2}::operator()() const::{lambda(float, float)#1}, "
        "at::detail::Array<char*, 3>)",
        30, 0, 128,
    ),
    "add": (
        _VEC + "at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >"
        "(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
        24, 0, 128,
    ),
    "mul": (
        _VEC + "at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::"
        "MulFunctor<float> >, at::detail::Array<char*, 2> >(int, at::native::AUnaryFunctor<float, "
        "float, float, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, "
        "2>)",
        16, 0, 128,
    ),
    "dropout": (
        "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, float, unsigned "
        "int, 1, 4, bool>(at::cuda::detail::TensorInfo<float const, unsigned int>, at::cuda::"
        "detail::TensorInfo<float, unsigned int>, at::cuda::detail::TensorInfo<bool, unsigned "
        "int>, unsigned int, float, at::PhiloxCudaState)",
        32, 0, 256,
    ),
    "dropout_bwd": (
        _VEC + "at::native::(anonymous namespace)::masked_scale_kernel<bool, float, float>"
        "(at::Tensor&, at::Tensor const&, at::Tensor const&, float)::{lambda(float, bool)#1}, "
        "at::detail::Array<char*, 3> >(int, at::native::(anonymous namespace)::"
        "masked_scale_kernel<bool, float, float>(at::Tensor&, at::Tensor const&, at::Tensor "
        "const&, float)::{lambda(float, bool)#1}, at::detail::Array<char*, 3>)",
        20, 0, 128,
    ),
    "reduce_sum": (
        "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::"
        "func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()"
        "(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >"
        "(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor"
        "<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
        "unsigned int, float, 4>)",
        32, 16, 512,
    ),
    "embed": (
        "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, "
        "2, 2, -2, true>(at::cuda::detail::TensorInfo<float, unsigned int>, at::cuda::detail::"
        "TensorInfo<float const, unsigned int>, at::cuda::detail::TensorInfo<long const, "
        "unsigned int>, int, int, unsigned int, unsigned int, long)",
        30, 0, 128,
    ),
    "embed_bwd": (
        "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, "
        "long>(long const*, float const*, float*, int, long, int, int)",
        38, 8192, 256,
    ),
    "softmax": (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)",
        40, 0, 1024,
    ),
    "softmax_bwd": (
        "void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, "
        "at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(float*, float const*, "
        "float const*, long)",
        38, 0, 1024,
    ),
    "nll": (
        "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, "
        "float, long>(float*, float*, float const*, long const*, float const*, bool, long, long, "
        "long, long)",
        30, 4096, 1024,
    ),
    "nll_bwd": (
        "void at::native::(anonymous namespace)::nll_loss_backward_reduce_cuda_kernel_2d<float, "
        "long>(float*, float const*, long const*, float const*, float const*, bool, int, int, "
        "long, long)",
        24, 0, 1024,
    ),
    "adam": (
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
        "(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
        "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double*, double, "
        "double, double, double, double, bool, double*, double*>(at::native::(anonymous "
        "namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
        "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double*, double, "
        "double, double, double, double, bool, double*, double*)",
        96, 0, 512,
    ),
    "nccl_ar": ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                96, 87568, 640),
}
for _k in K.values():  # kernel names go into the JSON unescaped
    assert json.dumps(_k[0])[1:-1] == _k[0]


def _ts(ns: int) -> str:
    """Microseconds with three decimals, exactly as Kineto prints ns-resolution time."""
    s, r = divmod(ns, 1000)
    return f"{s}.{r:03d}"


@lru_cache(maxsize=4096)
def _shape_args(dims: tuple, types: tuple, concrete: tuple | None = None) -> str:
    """The record_shapes args of a cpu_op (newest Kineto order: Concrete Inputs, Input type,
    Input Strides, Input Dims), built once per distinct call site."""
    strides = []
    for d in dims:
        st, acc = [], 1
        for x in reversed(d):
            st.append(acc)
            acc *= x
        strides.append(list(reversed(st)))
    conc = list(concrete) if concrete else [""] * len(dims)
    return (
        f'"Concrete Inputs": {json.dumps(conc)}, "Input type": {json.dumps(list(types))}, '
        f'"Input Strides": {json.dumps(strides)}, '
        f'"Input Dims": {json.dumps([list(d) for d in dims])}'
    )


# ------------------------------------------------------------------------------- the generator


@dataclass
class Thread:
    """A CPU thread: its clock, its buffered events (flushed per step) and its open op stack."""

    tid: int
    t: int
    buf: list = field(default_factory=list)
    ext: list = field(default_factory=list)  # External ids of open ops, innermost last


@dataclass
class Options:
    rank: int
    world: int
    seed: int
    target_events: int
    target_bytes: int
    path: str
    gzip: bool = False
    orphan_flows: bool = True
    ts_origin: str = "epoch"


class RankGen:
    """Simulates one rank's profiled training steps and writes its Kineto JSON file."""

    def __init__(self, o: Options) -> None:
        self.o = o
        self.rng = random.Random(o.seed * 1_000_003 + o.rank)
        r = self.rng
        self.dev = o.rank % 8
        self.pid = 100_000 + 7919 * o.rank + r.randrange(1000)
        t0 = EPOCH_NS + o.rank * 311_000 + r.randrange(100_000)
        self.base_ns = 0 if o.ts_origin == "epoch" else (t0 // 86_400_000_000_000 - 51) * (
            86_400_000_000_000)
        self.main = Thread(self.pid, t0)
        self.bwd = Thread(self.pid + 9_503, t0)
        self.t_start = t0
        self.sfree = {COMPUTE_STREAM: t0, NCCL_STREAM: t0}
        self.ext_id = 1
        self.rf_id = 0
        self.corr = 1_000 + r.randrange(500)
        self.ev_idx = 0
        self.seqno = 10_000
        self.flow_id = 0
        self.counts: dict[str, int] = {}
        self.nbytes = 0
        self.nevents = 0
        self.act: list[str] = []
        self.gpu_ann: list[str] = []
        self.ann_open: list[list] = []  # [name, ext, first_start, last_end]
        self.tape: list[tuple] = []
        self.act_live: list[tuple[int, int]] = []  # activations kept for backward (addr, bytes)
        self.grad_live: tuple[int, int] | None = None
        self.free_addrs: dict[int, list[int]] = {}
        self.next_addr = 139_926_520_725_504 + o.rank * (1 << 36)
        self.allocated = 2_300_000_000
        self.reserved = 4_194_304_000
        self.ranks_str = "[" + ", ".join(str(i) for i in range(o.world)) + "]"
        tmp = Path(o.path).parent
        stem = Path(o.path).name
        self.tmp = {
            k: tmp / f".{stem}.{k}.part" for k in ("bwd", "main", "act")
        }
        self.fh = {k: open(p, "w") for k, p in self.tmp.items()}

    # ---- low-level emission --------------------------------------------------------------

    def _count(self, key: str, s: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1
        self.nbytes += len(s)
        self.nevents += 1

    def _gap(self, lo: int = 300, hi: int = 2500) -> int:
        return self.rng.randint(lo, hi)

    def begin(self, th: Thread, name: str, cat: str = "cpu_op", shape: str | None = None,
              seq: int | None = None, fwd_tid: int = 0, extra: str | None = None,
              flow: tuple[str, int] | None = None, post: str | None = None) -> tuple:
        """Open an op on `th`: reserve its slot (written at `end` once dur is known)."""
        th.t += self._gap()
        ext = self.ext_id
        self.ext_id += 1
        self.rf_id += 1
        idx = len(th.buf)
        th.buf.append(None)
        if flow is not None:  # fwdbwd flow starts/ends exactly at the op's ts
            ph, fid = flow
            bp = ', "bp": "e"' if ph == "f" else ""
            s = (f'  {{\n    "ph": "{ph}", "id": {fid}, "pid": {self.pid}, "tid": {th.tid}, '
                 f'"ts": {_ts(th.t - self.base_ns)},\n    "cat": "fwdbwd", "name": "fwdbwd"{bp}\n'
                 f'  }},\n')
            th.buf.append(s)
            self._count(f"{ph}/fwdbwd", s)
        ev = self.ev_idx
        self.ev_idx += 1
        th.ext.append(ext)
        return (idx, th.t, name, cat, shape, seq, fwd_tid, extra, ext, self.rf_id, ev, post)

    def end(self, th: Thread, tok: tuple, tail: tuple[int, int] = (200, 1500)) -> int:
        """Close an op: its dur covers everything emitted on `th` since `begin`."""
        idx, ts, name, cat, shape, seq, fwd_tid, extra, ext, rf, ev, post = tok
        th.t += self._gap(*tail)
        th.ext.pop()
        a = [f'"External id": {ext},']
        if seq is not None:
            a.append(f'"Sequence number": {seq}, "Fwd thread id": {fwd_tid}, ')
        a.append(f'"Record function id": {rf}')
        if extra:
            a.append(", " + extra)
        if shape:
            a.append(", " + shape)
        a.append(f', "Ev Idx": {ev}')
        if post:
            a.append(", " + post)
        s = (f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {self.pid}, '
             f'"tid": {th.tid},\n    "ts": {_ts(ts - self.base_ns)}, "dur": {_ts(th.t - ts)},\n'
             f'    "args": {{\n      {"".join(a)}\n    }}\n  }},\n')
        th.buf[idx] = s
        self._count(f"X/{cat}", s)
        return ext

    def leaf(self, th: Thread, name: str, shape: str | None = None, work: int = 1500) -> None:
        tok = self.begin(th, name, shape=shape)
        th.t += self.rng.randint(work // 2, work * 2)
        self.end(th, tok)

    def mem(self, th: Thread, nbytes: int) -> int:
        """A `[memory]` allocation instant; the caching allocator reuses freed addresses."""
        th.t += self._gap(100, 600)
        pool = self.free_addrs.get(nbytes)
        if pool:
            addr = pool.pop()
        else:
            addr = self.next_addr
            self.next_addr += (nbytes + 511) // 512 * 512
        self.allocated += nbytes
        while self.allocated > self.reserved - 64 * 1024 * 1024:
            self.reserved += 20 * 1024 * 1024 * (1 + nbytes // (20 * 1024 * 1024))
        self._mem_event(th, addr, nbytes)
        return addr

    def free(self, th: Thread, addr: int, nbytes: int) -> None:
        if self.rng.random() < 0.5:  # the caching allocator polls pending events
            self.rt(th, "cudaEventQuery", 400, 1500)
        th.t += self._gap(100, 600)
        self.allocated -= nbytes
        self.free_addrs.setdefault(nbytes, []).append(addr)
        self._mem_event(th, addr, -nbytes)

    def _mem_event(self, th: Thread, addr: int, nbytes: int) -> None:
        ev = self.ev_idx
        self.ev_idx += 1
        s = (f'  {{\n    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",\n'
             f'    "pid": {self.pid}, "tid": {th.tid},\n    "ts": {_ts(th.t - self.base_ns)},\n'
             f'    "args": {{\n      "Ev Idx": {ev}, "Device Type": 1, "Device Id": {self.dev}, '
             f'"Addr": {addr}, "Bytes": {nbytes}, "Total Allocated": {self.allocated}, '
             f'"Total Reserved": {self.reserved}\n    }}\n  }},\n')
        th.buf.append(s)
        self._count("i/cpu_instant_event", s)

    def _runtime(self, th: Thread, name: str, dur: int) -> tuple[int, int, str]:
        th.t += self._gap(200, 1200)
        ts = th.t
        th.t += dur
        self.corr += self.rng.choice((1, 1, 1, 2, 3))
        ext = th.ext[-1] if th.ext else 0
        s = (f'  {{\n    "ph": "X", "cat": "cuda_runtime", "name": "{name}", "pid": {self.pid}, '
             f'"tid": {th.tid},\n    "ts": {_ts(ts - self.base_ns)}, "dur": {_ts(dur)},\n'
             f'    "args": {{\n      "External id": {ext},      "cbid": {CBID[name]}, '
             f'"correlation": {self.corr}\n    }}\n  }},\n')
        self._count("X/cuda_runtime", s)
        return ts, ext, s

    def _flow(self, ph: str, fid: int, pid: int, tid: int, ts: int) -> str:
        bp = ', "bp": "e"' if ph == "f" else ""
        s = (f'  {{\n    "ph": "{ph}", "id": {fid}, "pid": {pid}, "tid": {tid}, '
             f'"ts": {_ts(ts - self.base_ns)},\n    "cat": "ac2g", "name": "ac2g"{bp}\n  }},\n')
        self._count(f"{ph}/ac2g", s)
        return s

    def rt(self, th: Thread, name: str, lo: int = 700, hi: int = 4000) -> None:
        """A runtime call that launches nothing (with Kineto's lone ac2g `f`)."""
        ts, _, s = self._runtime(th, name, self.rng.randint(lo, hi))
        self.act.append(s)
        if self.o.orphan_flows:
            self.act.append(self._flow("f", self.corr, self.pid, th.tid, ts))

    def _gpu_slot(self, stream: int, launch_end: int, dur: int, after: int = 0) -> int:
        start = max(launch_end + self._gap(800, 4000), self.sfree[stream] + self._gap(600, 2500),
                    after)
        self.sfree[stream] = start + dur
        for a in self.ann_open:
            if stream == COMPUTE_STREAM:
                if a[2] is None:
                    a[2] = start
                a[3] = start + dur
        return start

    def launch(self, th: Thread, key: str, grid: tuple[int, int, int], dur_ns: float,
               stream: int = COMPUTE_STREAM, api: str = "cudaLaunchKernel",
               extra: str = "", after: int = 0) -> int:
        """cudaLaunchKernel + the kernel it launches + their ac2g s/f pair."""
        rts, ext, rs = self._runtime(th, api, self.rng.randint(3500, 9000))
        name, regs, smem, block = K[key]
        dur = max(1000, int(dur_ns * self.rng.uniform(0.93, 1.08)))
        start = self._gpu_slot(stream, th.t, dur, after)
        nblocks = grid[0] * grid[1] * grid[2]
        bps = nblocks / NUM_SMS
        wps = bps * ((block + 31) // 32)
        occ = min(100, int(wps / 64 * 100))
        ks = (f'  {{\n    "ph": "X", "cat": "kernel", "name": "{name}", "pid": {self.dev}, '
              f'"tid": {stream},\n    "ts": {_ts(start - self.base_ns)}, "dur": {_ts(dur)},\n'
              f'    "args": {{\n      "External id": {ext},      "queued": 0, '
              f'"device": {self.dev}, "context": 1,      "stream": {stream}, '
              f'"correlation": {self.corr},      '
              f'"registers per thread": {regs},      "shared memory": {smem},      '
              f'"blocks per SM": {bps:f},      "warps per SM": {wps:f},      '
              f'"grid": [{grid[0]}, {grid[1]}, {grid[2]}],      "block": [{block}, 1, 1],      '
              f'"est. achieved occupancy %": {occ}{extra}\n    }}\n  }},\n')
        self._count("X/kernel", ks)
        self.act.append(ks)
        self.act.append(self._flow("f", self.corr, self.dev, stream, start))
        self.act.append(rs)
        self.act.append(self._flow("s", self.corr, self.pid, th.tid, rts))
        return start + dur

    def copy(self, th: Thread, kind: str, nbytes: int, memset: bool = False) -> int:
        """cudaMemcpyAsync / cudaMemsetAsync + the gpu_memcpy / gpu_memset activity."""
        api = "cudaMemsetAsync" if memset else "cudaMemcpyAsync"
        if kind == "DtoD":  # the stream guard PyTorch runs around every device copy
            for name in ("cudaStreamIsCapturing", "cudaStreamGetPriority",
                         "cudaDeviceGetStreamPriorityRange"):
                self.rt(th, name, 400, 1500)
        rts, ext, rs = self._runtime(th, api, self.rng.randint(4000, 12000))
        bw = {"HtoD": 22e9, "DtoH": 20e9, "DtoD": 900e9, "set": 1100e9}[kind]
        dur = max(900, int(nbytes / bw * 1e9 * self.rng.uniform(0.95, 1.1)) + 1200)
        start = self._gpu_slot(COMPUTE_STREAM, th.t, dur)
        if memset:
            name, cat = "Memset (Device)", "gpu_memset"
        else:
            name = {"HtoD": "Memcpy HtoD (Pageable -> Device)",
                    "DtoH": "Memcpy DtoH (Device -> Pageable)",
                    "DtoD": "Memcpy DtoD (Device -> Device)"}[kind]
            cat = "gpu_memcpy"
        gbs = nbytes / dur  # bytes per ns == GB/s
        s = (f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {self.dev}, '
             f'"tid": {COMPUTE_STREAM},\n    "ts": {_ts(start - self.base_ns)}, '
             f'"dur": {_ts(dur)},\n    "args": {{\n      "External id": {ext},      '
             f'"device": {self.dev}, "context": 1,      "stream": {COMPUTE_STREAM}, '
             f'"correlation": {self.corr},      "bytes": {nbytes}, '
             f'"memory bandwidth (GB/s)": {gbs!r}\n    }}\n  }},\n')
        self._count(f"X/{cat}", s)
        self.act.append(s)
        self.act.append(self._flow("f", self.corr, self.dev, COMPUTE_STREAM, start))
        self.act.append(rs)
        self.act.append(self._flow("s", self.corr, self.pid, th.tid, rts))
        return start + dur

    def sync(self, th: Thread) -> None:
        """cudaStreamSynchronize: the host blocks until the compute stream drains (cuda_sync)."""
        th.t += self._gap(200, 1200)
        rts = th.t
        self.corr += 1
        ext = th.ext[-1] if th.ext else 0
        sts = max(rts + self._gap(800, 2500), 0)
        done = max(self.sfree[COMPUTE_STREAM], sts) + self._gap(1000, 4000)
        th.t = done + self._gap(1500, 5000)
        ss = (f'  {{\n    "ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": {self.dev}, '
              f'"tid": {COMPUTE_STREAM},\n    "ts": {_ts(sts - self.base_ns)}, '
              f'"dur": {_ts(done - sts)},\n    "args": {{\n      "External id": {ext},      '
              f'"cuda_sync_kind": "Stream Sync",      "stream": {COMPUTE_STREAM}, '
              f'"correlation": {self.corr},      "device": {self.dev}, "context": 1\n'
              f'    }}\n  }},\n')
        self._count("X/cuda_sync", ss)
        rs = (f'  {{\n    "ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", '
              f'"pid": {self.pid}, "tid": {th.tid},\n    "ts": {_ts(rts - self.base_ns)}, '
              f'"dur": {_ts(th.t - rts)},\n    "args": {{\n      "External id": {ext},      '
              f'"cbid": {CBID["cudaStreamSynchronize"]}, "correlation": {self.corr}\n'
              f'    }}\n  }},\n')
        self._count("X/cuda_runtime", rs)
        self.act.append(ss)
        self.act.append(self._flow("f", self.corr, self.dev, COMPUTE_STREAM, sts))
        self.act.append(rs)
        self.act.append(self._flow("s", self.corr, self.pid, th.tid, rts))
        self.sfree[COMPUTE_STREAM] = done

    def annotate(self, th: Thread, name: str, gpu: bool = False) -> tuple:
        tok = self.begin(th, name, cat="user_annotation")
        if gpu:
            self.ann_open.append([name, tok[8], None, None])
        return tok

    def end_annotate(self, th: Thread, tok: tuple, gpu: bool = False) -> None:
        self.end(th, tok)
        if gpu:
            name, ext, first, last = self.ann_open.pop()
            if first is not None:
                s = (f'  {{\n    "ph": "X", "cat": "gpu_user_annotation", "name": "{name}", '
                     f'"pid": {self.dev}, "tid": {COMPUTE_STREAM},\n    "ts": '
                     f'{_ts(first - self.base_ns)}, "dur": {_ts(last - first)},\n    "args": {{\n'
                     f'      "External id": {ext}\n    }}\n  }},\n')
                self._count("X/gpu_user_annotation", s)
                self.gpu_ann.append(s)

    # ---- model pieces -------------------------------------------------------------------

    def _fwd_node(self, th: Thread, name: str, shape: str, bw: str, kind: str,
                  payload: tuple = ()) -> tuple:
        """Open a forward op that creates an autograd node (Sequence number + fwdbwd `s`)."""
        self.seqno += 1
        self.flow_id += 1
        tok = self.begin(th, name, shape=shape, seq=self.seqno, flow=("s", self.flow_id))
        self.tape.append((self.seqno, self.flow_id, bw, kind, payload))
        return tok

    def _keep(self, th: Thread, nbytes: int) -> None:
        self.act_live.append((self.mem(th, nbytes), nbytes))

    def linear(self, th: Thread, m: int, k: int, n: int, params: list) -> None:
        t = self.begin(th, "aten::linear", shape=_shape_args(((m, k), (n, k), (n,)),
                                                             ("float", "float", "float")))
        t2 = self.begin(th, "aten::t", shape=_shape_args(((n, k),), ("float",)))
        t3 = self.begin(th, "aten::transpose", shape=_shape_args(
            ((n, k), (), ()), ("float", "Scalar", "Scalar"), ("", "0", "1")))
        self.leaf(th, "aten::as_strided", _shape_args(
            ((n, k), (), (), ()), ("float", "", "", ""), ("", f"[{k}, {n}]", f"[1, {k}]", "")))
        self.end(th, t3)
        self.end(th, t2)
        t4 = self._fwd_node(th, "aten::addmm", _shape_args(
            ((n,), (m, k), (k, n), (), ()), ("float", "float", "float", "Scalar", "Scalar"),
            ("", "", "", "1", "1")), "AddmmBackward0", "addmm", (m, k, n))
        self._keep(th, m * n * 4)
        if self.rng.random() < 0.3:  # cuBLAS configures some kernels before launching them
            self.rt(th, "cudaFuncSetAttribute")
            self.rt(th, "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags")
        gk = "gemm_tn" if n >= k else "gemm_nn"
        self.launch(th, gk, ((n + 127) // 128, (m + 127) // 128, 1),
                    2 * m * k * n / GEMM_FLOPS * 1e9)
        self.end(th, t4)
        self.end(th, t)
        params += [n * k, n]

    def layer_norm(self, th: Thread, params: list) -> None:
        m, h = TOKENS, HIDDEN
        t = self.begin(th, "aten::layer_norm", shape=_shape_args(
            ((BATCH, SEQ, h), (), (h,), (h,), (), ()),
            ("float", "ScalarList", "float", "float", "Scalar", "Scalar"),
            ("", f"[{h}]", "", "", "1e-05", "True")))
        t2 = self._fwd_node(th, "aten::native_layer_norm", _shape_args(
            ((BATCH, SEQ, h), (), (h,), (h,), ()), ("float", "ScalarList", "float", "float",
                                                    "Scalar"),
            ("", f"[{h}]", "", "", "1e-05")), "NativeLayerNormBackward0", "ln", ())
        self._keep(th, m * h * 4)
        self._keep(th, m * 4)
        self._keep(th, m * 4)
        self.launch(th, "ln_fwd", (m, 1, 1), 3 * m * h * 4 / HBM_BPS * 1e9)
        self.end(th, t2)
        self.end(th, t)
        params += [h, h]

    def elementwise(self, th: Thread, name: str, bw: str, kind: str, key: str, nel: int,
                    nin: int = 1) -> None:
        dims = tuple((BATCH, SEQ, nel // TOKENS) for _ in range(nin))
        t = self._fwd_node(th, name, _shape_args(dims, ("float",) * nin), bw, kind, (nel,))
        self._keep(th, nel * 4)
        self.launch(th, key, ((nel + 511) // 512, 1, 1), (nin + 1) * nel * 4 / HBM_BPS * 1e9)
        self.end(th, t)

    def attention(self, th: Thread) -> None:
        hd = HIDDEN // HEADS
        q = (BATCH, HEADS, SEQ, hd)
        t = self.begin(th, "aten::scaled_dot_product_attention", shape=_shape_args(
            (q, q, q, (), (), (), ()), ("float", "float", "float", "", "Scalar", "Scalar", ""),
            ("", "", "", "", "0.1", "True", "")))
        t2 = self._fwd_node(th, "aten::_scaled_dot_product_efficient_attention", _shape_args(
            (q, q, q, (), (), (), ()), ("float", "float", "float", "", "Scalar", "Scalar", ""),
            ("", "", "", "", "True", "0.1", "True")),
            "ScaledDotProductEfficientAttentionBackward0", "attn", ())
        t3 = self.begin(th, "aten::_efficient_attention_forward", shape=_shape_args(
            ((BATCH, SEQ, HEADS, hd),) * 3, ("float",) * 3))
        self.leaf(th, "aten::empty", _shape_args(((), (), (), (), (), ()), ("ScalarList", "Scalar",
                  "", "", "", "")))
        self._keep(th, TOKENS * HIDDEN * 4)
        self._keep(th, BATCH * HEADS * SEQ * 4)
        flops = 4 * BATCH * HEADS * SEQ * SEQ * hd / 2
        self.launch(th, "attn_fwd", (SEQ // 64, HEADS, BATCH), flops / (0.6 * GEMM_FLOPS) * 1e9,
                    api="cudaLaunchKernelExC")
        self.end(th, t3)
        self.end(th, t2)
        self.end(th, t)

    def view(self, th: Thread, shape: tuple) -> None:
        t = self._fwd_node(th, "aten::view", _shape_args((shape, ()), ("float", "ScalarList")),
                           "ViewBackward0", "view", ())
        self.end(th, t)

    def block(self, th: Thread, params: list) -> None:
        """One transformer block forward (pre-norm, fused qkv, GELU MLP, dropout residuals)."""
        self.layer_norm(th, params)
        self.linear(th, TOKENS, HIDDEN, 3 * HIDDEN, params)
        self.view(th, (BATCH, SEQ, 3, HEADS, HIDDEN // HEADS))
        for _ in range(3):
            self.leaf(th, "aten::select", _shape_args(((BATCH, SEQ, 3, HEADS, 64), (), ()),
                                                      ("float", "Scalar", "Scalar")))
        self.attention(th)
        self.view(th, (TOKENS, HIDDEN))
        self.linear(th, TOKENS, HIDDEN, HIDDEN, params)
        self.elementwise(th, "aten::native_dropout", "NativeDropoutBackward0", "dropout",
                         "dropout", TOKENS * HIDDEN)
        self.elementwise(th, "aten::add", "AddBackward0", "add", "add", TOKENS * HIDDEN, 2)
        self.layer_norm(th, params)
        self.linear(th, TOKENS, HIDDEN, FFN, params)
        self.elementwise(th, "aten::gelu", "GeluBackward0", "gelu", "gelu", TOKENS * FFN)
        self.linear(th, TOKENS, FFN, HIDDEN, params)
        self.elementwise(th, "aten::native_dropout", "NativeDropoutBackward0", "dropout",
                         "dropout", TOKENS * HIDDEN)
        self.elementwise(th, "aten::add", "AddBackward0", "add", "add", TOKENS * HIDDEN, 2)

    def forward(self, th: Thread) -> list:
        params: list[int] = []
        t = self.annotate(th, "DistributedDataParallel.forward", gpu=True)
        for name in ("cudaStreamIsCapturing", "cudaEventQuery"):
            self.rt(th, name)
        t2 = self._fwd_node(th, "aten::embedding", _shape_args(
            ((VOCAB, HIDDEN), (BATCH, SEQ), (), (), ()), ("float", "long int", "Scalar", "Scalar",
                                                          "Scalar"), ("", "", "-1", "False",
                                                                      "False")),
            "EmbeddingBackward0", "embed", ())
        self._keep(th, TOKENS * HIDDEN * 4)
        self.launch(th, "embed", (TOKENS * HIDDEN // 512, 1, 1),
                    TOKENS * HIDDEN * 8 / HBM_BPS * 1e9)
        self.end(th, t2)
        params.append(VOCAB * HIDDEN)
        for _ in range(LAYERS):
            self.block(th, params)
        self.layer_norm(th, params)
        self.linear(th, TOKENS, HIDDEN, VOCAB, params)
        self.end_annotate(th, t, gpu=True)
        # loss = cross_entropy(logits, labels)
        t = self.begin(th, "aten::cross_entropy_loss", shape=_shape_args(
            ((TOKENS, VOCAB), (TOKENS,), (), (), (), ()), ("float", "long int", "", "Scalar",
                                                          "Scalar", "Scalar")))
        t2 = self._fwd_node(th, "aten::log_softmax", _shape_args(((TOKENS, VOCAB), (), ()), (
            "float", "Scalar", "")), "LogSoftmaxBackward0", "logsoftmax", ())
        t3 = self.begin(th, "aten::_log_softmax", shape=_shape_args(
            ((TOKENS, VOCAB), (), ()), ("float", "Scalar", "Scalar")))
        self._keep(th, TOKENS * VOCAB * 4)
        self.launch(th, "softmax", (TOKENS, 1, 1), 2 * TOKENS * VOCAB * 4 / HBM_BPS * 1e9)
        self.end(th, t3)
        self.end(th, t2)
        t2 = self._fwd_node(th, "aten::nll_loss_nd", _shape_args(
            ((TOKENS, VOCAB), (TOKENS,), (), (), ()), ("float", "long int", "", "Scalar",
                                                      "Scalar")), "NllLossBackward0", "nll", ())
        t3 = self.begin(th, "aten::nll_loss_forward", shape=_shape_args(
            ((TOKENS, VOCAB), (TOKENS,), (), (), ()), ("float", "long int", "", "Scalar",
                                                      "Scalar")))
        t4 = self.begin(th, "aten::zeros", shape=_shape_args(((), (), (), (), ()), (
            "ScalarList", "Scalar", "", "", "")))
        self._keep(th, 512)
        self.copy(th, "set", 4, memset=True)
        self.end(th, t4)
        self.launch(th, "nll", (1, 1, 1), 9000)
        self.end(th, t3)
        self.end(th, t2)
        self.end(th, t)
        return params

    def backward_node(self, th: Thread, node: tuple) -> None:
        seq, fid, bw, kind, payload = node
        t0 = self.begin(th, f"autograd::engine::evaluate_function: {bw}", seq=seq, fwd_tid=1)
        t1 = self.begin(th, bw, seq=seq, fwd_tid=1, flow=("f", fid))
        temps: list[tuple[int, int]] = []
        if kind == "addmm":
            m, k, n = payload
            for a, b, c, key in ((m, n, k, "gemm_nn"), (n, m, k, "gemm_nt")):
                t = self.begin(th, "aten::t", shape=_shape_args(((k, n),), ("float",)))
                self.leaf(th, "aten::transpose", _shape_args(
                    ((k, n), (), ()), ("float", "Scalar", "Scalar"), ("", "0", "1")))
                self.end(th, t)
                t = self.begin(th, "aten::mm", shape=_shape_args(((a, b), (b, c)),
                                                                 ("float", "float")))
                temps.append((self.mem(th, a * c * 4), a * c * 4))
                self.launch(th, key, ((c + 127) // 128, (a + 127) // 128, 1),
                            2 * a * b * c / GEMM_FLOPS * 1e9)
                self.end(th, t)
            t = self.begin(th, "aten::sum", shape=_shape_args(((m, n), (), (), ()), (
                "float", "ScalarList", "Scalar", "")), extra=None)
            temps.append((self.mem(th, n * 4), n * 4))
            self.launch(th, "reduce_sum", (max(1, n // 128), 1, 1), m * n * 4 / HBM_BPS * 1e9)
            self.end(th, t)
            self.leaf(th, "aten::view", _shape_args(((n,), ()), ("float", "ScalarList")))
        elif kind == "ln":
            t = self.begin(th, "aten::native_layer_norm_backward", shape=_shape_args(
                ((BATCH, SEQ, HIDDEN), (BATCH, SEQ, HIDDEN), (), (BATCH, SEQ, 1), (BATCH, SEQ, 1),
                 (HIDDEN,), (HIDDEN,), ()), ("float", "float", "ScalarList", "float", "float",
                                             "float", "float", "ScalarList")))
            for nb in (TOKENS * HIDDEN * 4, HIDDEN * 4, HIDDEN * 4):
                self.leaf(th, "aten::empty_like", _shape_args(((HIDDEN,), (), (), (), (), ()), (
                    "float", "", "", "", "", "")))
                temps.append((self.mem(th, nb), nb))
            self.launch(th, "ln_bwd_in", (TOKENS, 1, 1), 4 * TOKENS * HIDDEN * 4 / HBM_BPS * 1e9)
            self.launch(th, "ln_bwd_gb", (HIDDEN // 32, 1, 1), 3 * TOKENS * HIDDEN * 4 / HBM_BPS
                        * 1e9)
            self.end(th, t)
        elif kind == "attn":
            hd = HIDDEN // HEADS
            t = self.begin(th, "aten::_scaled_dot_product_efficient_attention_backward")
            t2 = self.begin(th, "aten::_efficient_attention_backward")
            for _ in range(3):
                temps.append((self.mem(th, TOKENS * HIDDEN * 4), TOKENS * HIDDEN * 4))
            tz = self.begin(th, "aten::zeros")
            temps.append((self.mem(th, BATCH * HEADS * SEQ * 4), BATCH * HEADS * SEQ * 4))
            self.copy(th, "set", BATCH * HEADS * SEQ * 4, memset=True)
            self.end(th, tz)
            self.rt(th, "cudaFuncSetAttribute")
            flops = 10 * BATCH * HEADS * SEQ * SEQ * hd / 2
            self.launch(th, "attn_bwd", (SEQ // 64, HEADS, BATCH), flops / (0.5 * GEMM_FLOPS)
                        * 1e9, api="cudaLaunchKernelExC")
            self.end(th, t2)
            self.end(th, t)
        elif kind in ("gelu", "dropout"):
            (nel,) = payload
            name = "aten::gelu_backward" if kind == "gelu" else "aten::native_dropout_backward"
            key = "gelu_bwd" if kind == "gelu" else "dropout_bwd"
            t = self.begin(th, name, shape=_shape_args(((BATCH, SEQ, nel // TOKENS),) * 2,
                                                       ("float", "float")))
            temps.append((self.mem(th, nel * 4), nel * 4))
            self.launch(th, key, ((nel + 511) // 512, 1, 1), 3 * nel * 4 / HBM_BPS * 1e9)
            self.end(th, t)
        elif kind == "view":
            t = self.begin(th, "aten::reshape")
            self.leaf(th, "aten::view")
            self.end(th, t)
        elif kind == "embed":
            t = self.begin(th, "aten::embedding_backward")
            t2 = self.begin(th, "aten::embedding_dense_backward")
            temps.append((self.mem(th, VOCAB * HIDDEN * 4), VOCAB * HIDDEN * 4))
            self.copy(th, "set", VOCAB * HIDDEN * 4, memset=True)
            self.launch(th, "embed_bwd", (HIDDEN // 32, 1, 1), TOKENS * HIDDEN * 12 / HBM_BPS * 1e9)
            self.end(th, t2)
            self.end(th, t)
        elif kind == "logsoftmax":
            t = self.begin(th, "aten::_log_softmax_backward_data")
            temps.append((self.mem(th, TOKENS * VOCAB * 4), TOKENS * VOCAB * 4))
            self.launch(th, "softmax_bwd", (TOKENS, 1, 1), 3 * TOKENS * VOCAB * 4 / HBM_BPS * 1e9)
            self.end(th, t)
        elif kind == "nll":
            t = self.begin(th, "aten::nll_loss_backward")
            tz = self.begin(th, "aten::zero_")
            temps.append((self.mem(th, TOKENS * VOCAB * 4), TOKENS * VOCAB * 4))
            self.copy(th, "set", TOKENS * VOCAB * 4, memset=True)
            self.end(th, tz)
            self.launch(th, "nll_bwd", (TOKENS // 1024 + 1, 1, 1), 6000)
            self.end(th, t)
        # kind == "add": AddBackward0 only passes gradients through
        self.end(th, t1)
        # the autograd engine releases what the node saved, then the temporaries it made
        if self.act_live:
            for _ in range(min(len(self.act_live), 1 + (kind in ("ln", "attn")) * 2)):
                addr, nb = self.act_live.pop()
                self.free(th, addr, nb)
        # temporaries die now; the node's output gradient lives until the next node consumed it
        if temps:
            if self.grad_live is not None:
                self.free(th, *self.grad_live)
            self.grad_live = temps[-1]
            for addr, nb in temps[:-1]:
                self.free(th, addr, nb)
        self.end(th, t0)

    def accumulate_grad(self, th: Thread, numel: int) -> None:
        t0 = self.begin(th, "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad")
        t1 = self.begin(th, "torch::autograd::AccumulateGrad")
        t2 = self.begin(th, "aten::detach", shape=_shape_args(((numel,),), ("float",)))
        self.leaf(th, "detach", _shape_args(((numel,),), ("float",)), work=600)
        self.end(th, t2)
        self.end(th, t1)
        self.end(th, t0)
        t = self.begin(th, "torch::distributed::reducer::mul_out")
        t2 = self.begin(th, "aten::mul", shape=_shape_args(((numel,), ()), ("float", "Scalar"),
                                                           ("", "0.125")))
        self.rt(th, "cudaStreamIsCapturing", 400, 1500)
        self.launch(th, "mul", ((numel + 511) // 512, 1, 1), 2 * numel * 4 / HBM_BPS * 1e9)
        self.end(th, t2)
        self.end(th, t)

    def allreduce(self, th: Thread, nelems: int) -> None:
        """DDP bucket all-reduce: c10d op, record_param_comms, NCCL kernel on the comm stream."""
        t = self.begin(th, "c10d::allreduce_")
        comm = (f'"Process Group Name": "0", "Global rank stride": 1, "Out msg nelems": {nelems}, '
                f'"Process Group Ranks": "{self.ranks_str}", "Group size": {self.o.world}, '
                f'"Global rank start": 0')
        tail = (f'"In msg nelems": {nelems}, "In split size": "[]", "Out split size": "[]", '
                f'"dtype": "Float", "Process Group Description": "default_pg", '
                f'"Collective name": "allreduce"')
        # Kineto writes record_param_comms args with "Ev Idx" in the middle
        t2 = self.begin(th, "record_param_comms", extra=comm, post=tail)
        for name in ("cudaStreamIsCapturing", "cudaEventRecord", "cudaStreamWaitEvent"):
            self.rt(th, name)
        t3 = self.begin(th, "nccl:all_reduce", cat="user_annotation")
        self.rt(th, "cudaStreamGetCaptureInfo_v2")
        self.rt(th, "cudaEventRecord")
        self.rt(th, "cudaStreamWaitEvent")
        nbytes = nelems * 4
        n = self.o.world
        ring = 2 * (n - 1) / n * nbytes / 180e9 * 1e9 + 12_000 * (n - 1)
        skew = self.rng.expovariate(1 / 40_000)  # waiting for the slowest rank
        kargs = (f', "Collective name": "allreduce", "In msg nelems": {nelems}, '
                 f'"Out msg nelems": {nelems}, "Group size": {n}, "dtype": "Float", '
                 f'"In split size": "[]", "Out split size": "[]", "Process Group Name": "0", '
                 f'"Process Group Description": "default_pg", '
                 f'"Process Group Ranks": "{self.ranks_str}"')
        self.launch(th, "nccl_ar", (16, 1, 1), ring + skew, stream=NCCL_STREAM,
                    api="cudaLaunchKernelExC", extra=kargs, after=self.sfree[COMPUTE_STREAM])
        self.rt(th, "cudaEventRecord")
        self.rt(th, "cudaStreamWaitEvent")
        self.end(th, t3)
        self.rt(th, "cudaEventRecord")
        self.end(th, t2)
        self.end(th, t)

    def backward(self, main: Thread, params: list) -> None:
        th = self.bwd
        t = self.annotate(main, "## backward ##", gpu=True)
        th.t = max(th.t, main.t) + self._gap(5000, 15000)
        bucket, pending = 0, []
        grads = list(reversed(params))
        gi = 0
        for node in reversed(self.tape):
            self.backward_node(th, node)
            if node[3] in ("addmm", "ln", "embed"):
                for _ in range(2 if node[3] != "embed" else 1):
                    if gi < len(grads):
                        numel = grads[gi]
                        gi += 1
                        self.accumulate_grad(th, numel)
                        bucket += numel
                        pending.append(numel)
                        if bucket * 4 >= DDP_BUCKET_BYTES:
                            self.allreduce(th, bucket)
                            bucket = 0
        if bucket:
            self.allreduce(th, bucket)
        # finalize: wait for the comm stream, copy buckets back into .grad
        self.rt(th, "cudaStreamWaitEvent")
        self.sfree[COMPUTE_STREAM] = max(self.sfree[COMPUTE_STREAM], self.sfree[NCCL_STREAM])
        for numel in pending:
            t2 = self.begin(th, "torch.distributed.ddp.reducer::copy_bucket_to_grad")
            t3 = self.begin(th, "aten::copy_", shape=_shape_args(((numel,), (numel,), ()), (
                "float", "float", "Scalar"), ("", "", "False")))
            self.copy(th, "DtoD", numel * 4)
            self.end(th, t3)
            self.end(th, t2)
        while self.act_live:
            addr, nb = self.act_live.pop()
            self.free(th, addr, nb)
        if self.grad_live is not None:
            self.free(th, *self.grad_live)
            self.grad_live = None
        self.tape.clear()
        main.t = max(main.t, th.t) + self._gap(3000, 9000)
        self.end_annotate(main, t, gpu=True)

    def optimizer(self, th: Thread, params: list) -> None:
        t = self.annotate(th, "## optimizer ##")
        t2 = self.annotate(th, "Optimizer.step#AdamW.step", gpu=True)
        t3 = self.begin(th, "aten::_fused_adamw_")
        chunk = 48
        for i in range(0, len(params), chunk):
            numel = sum(params[i:i + chunk])
            self.rt(th, "cudaStreamIsCapturing")
            self.launch(th, "adam", (max(1, numel // 65536), 1, 1), 16 * numel * 4 / HBM_BPS
                        * 1e9)
        self.end(th, t3)
        self.end_annotate(th, t2, gpu=True)
        self.end_annotate(th, t)

    def step(self, n: int) -> None:
        th = self.main
        ts = self.annotate(th, f"ProfilerStep#{n}")
        t = self.annotate(th, "Optimizer.zero_grad#AdamW.zero_grad")
        self.end_annotate(th, t)
        t = self.annotate(th, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")
        for _ in range(6):
            self.leaf(th, "aten::stack", work=9000)
        self.end_annotate(th, t)
        for _ in range(2):  # inputs and labels to the GPU
            t = self.begin(th, "aten::to", shape=_shape_args(((BATCH, SEQ), (), (), (), (), ()), (
                "long int", "", "Scalar", "Scalar", "Scalar", "")))
            t2 = self.begin(th, "aten::_to_copy")
            self.leaf(th, "aten::empty_strided")
            self._keep(th, TOKENS * 8)
            t3 = self.begin(th, "aten::copy_")
            self.copy(th, "HtoD", TOKENS * 8)
            self.end(th, t3)
            self.end(th, t2)
            self.end(th, t)
        t = self.annotate(th, "## forward ##", gpu=True)
        params = self.forward(th)
        self.end_annotate(th, t, gpu=True)
        self.backward(th, params)
        self.optimizer(th, params)
        t = self.begin(th, "aten::item")
        t2 = self.begin(th, "aten::_local_scalar_dense")
        self.copy(th, "DtoH", 4)
        self.sync(th)
        self.end(th, t2)
        self.end(th, t)
        self.end_annotate(th, ts)

    # ---- file assembly ------------------------------------------------------------------

    def _flush(self) -> None:
        for key, th in (("main", self.main), ("bwd", self.bwd)):
            self.fh[key].write("".join(th.buf))
            th.buf.clear()
        self.fh["act"].write("".join(self.act))
        self.act.clear()

    def _header(self) -> str:
        dp = []
        for i in range(8):
            dp.append(
                f'    {{\n      "id": {i}, "name": "{DEVICE_NAME}", "totalGlobalMem": 85100068864,'
                '\n      "computeMajor": 8, "computeMinor": 0,\n      "maxThreadsPerBlock": 1024, '
                '"maxThreadsPerMultiprocessor": 2048,\n      "regsPerBlock": 65536, "warpSize": 32,'
                f'\n      "sharedMemPerBlock": 49152, "numSms": {NUM_SMS}\n    , '
                '"regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 166912, '
                '"sharedMemPerMultiProcessor": 167936\n    }')
        ranks = list(range(self.o.world))
        dist = json.dumps({
            "backend": "nccl", "rank": self.o.rank, "world_size": self.o.world, "pg_count": 1,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                           "pg_size": self.o.world, "ranks": ranks}],
            "nccl_version": "2.20.5"})
        return ('{\n  "schemaVersion": 1,\n  "deviceProperties": [\n' + ",\n".join(dp)
                + f'\n  ],\n  "distributedInfo": {dist},\n  "record_shapes": 1,\n'
                '  "profile_memory": 1,\n  "traceEvents": [\n')

    def _meta(self, t_first: int, t_end: int) -> str:
        mts = _ts(self.main_first - self.base_ns)
        out = []

        def m(name: str, pid: object, tid: object, key: str, val: str, ts: str = mts) -> None:
            s = (f'  {{\n    "name": "{name}", "ph": "M", "ts": {ts}, "pid": {pid}, "tid": {tid},'
                 f'\n    "args": {{\n      "{key}": {val}\n    }}\n  }},\n')
            self._count("M/", s)
            out.append(s)

        m("process_name", self.pid, 0, "name", '"python3.10"')
        m("process_labels", self.pid, 0, "labels", '"CPU"')
        m("process_sort_index", self.pid, 0, "sort_index", str(self.pid))
        for d in range(8):
            m("process_name", d, 0, "name", '"python3.10"')
            m("process_labels", d, 0, "labels", f'"GPU {d}"')
            m("process_sort_index", d, 0, "sort_index", str(16777216 + d))
        for s in (COMPUTE_STREAM, NCCL_STREAM):
            m("thread_name", self.dev, s, "name", f'"stream {s} "')
            m("thread_sort_index", self.dev, s, "sort_index", str(s))
        for tid, tname in ((self.bwd.tid, "pt_main_thread"), (self.main.tid, "pt_main_thread"),
                           (self.bwd.tid, "pt_autograd_0")):
            m("thread_name", self.pid, tid, "name", f'"thread {tid} ({tname})"')
            m("thread_sort_index", self.pid, tid, "sort_index", str(tid))
        ft = _ts(t_first - self.base_ns)
        s = (f'  {{\n    "ph": "X", "cat": "Trace", "ts": {ft}, "dur": {_ts(t_end - t_first)},\n'
             f'    "pid": "Spans", "tid": "PyTorch Profiler",\n    "name": "PyTorch Profiler (0)",'
             f'\n    "args": {{\n      "Op count": 0\n    }}\n  }},\n')
        self._count("X/Trace", s)
        out.append(s)
        m("process_sort_index", '"Spans"', 0, "sort_index", "536870912", ts=ft)
        s = (f'  {{\n    "name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",\n'
             f'    "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": {ft}\n  }},\n')
        self._count("i/", s)
        out.append(s)
        s = (f'  {{\n    "name": "Record Window End", "ph": "i", "s": "g",\n'
             f'    "pid": "", "tid": "", "ts": {_ts(t_end + 1_500_000 - self.base_ns)}\n  }}\n')
        self._count("i/", s)
        out.append(s)
        return "".join(out)

    def run(self) -> dict:
        """Generate steps until the event or byte target is met, then assemble the file."""
        t_first = self.t_start - self.rng.randint(20_000_000, 40_000_000)
        self.main.t += self.rng.randint(100_000, 400_000)
        self.main_first = self.main.t
        step, per_ev, per_b = 100, 0, 0
        # whole steps only; stop when the next one would overshoot by more than half a step
        while (self.nevents + per_ev // 2 < self.o.target_events
               and self.nbytes + per_b // 2 < self.o.target_bytes):
            ev0, b0 = self.nevents, self.nbytes
            self.step(step)
            step += 1
            self._flush()
            per_ev, per_b = self.nevents - ev0, self.nbytes - b0
        t_end = max(self.main.t, self.sfree[COMPUTE_STREAM], self.sfree[NCCL_STREAM])
        for f in self.fh.values():
            f.close()
        meta = self._meta(t_first, t_end)
        head = self._header()
        tail = (f'  ],\n  "traceName": "{Path(self.o.path).name}",\n  "displayTimeUnit": "ms",\n'
                f'  "baseTimeNanoseconds": {self.base_ns}\n}}\n')
        part = self.o.path + ".part"
        out = gzip.open(part, "wt", compresslevel=6) if self.o.gzip else open(part, "w")
        with out:
            out.write(head)
            for key in ("bwd", "main", "act"):
                with open(self.tmp[key]) as src:
                    shutil.copyfileobj(src, out, 1 << 22)
                os.unlink(self.tmp[key])
            out.write("".join(reversed(self.gpu_ann)))
            out.write(meta)
            out.write(tail)
        os.replace(part, self.o.path)
        json_bytes = self.nbytes + len(head) + len(tail)
        return {"path": self.o.path, "rank": self.o.rank, "events": self.nevents,
                "json_bytes": json_bytes, "file_bytes": os.path.getsize(self.o.path),
                "steps": step - 100, "counts": dict(sorted(self.counts.items()))}


def _run_one(o: Options) -> dict:
    t = time.perf_counter()
    res = RankGen(o).run()
    res["seconds"] = round(time.perf_counter() - t, 2)
    return res


def generate(outdir: str | os.PathLike, ranks: int = 8, events: int = 1_600_000,
             single_file_mb: float | None = None, use_gzip: bool = False, seed: int = 0,
             jobs: int | None = None, orphan_flows: bool = True,
             ts_origin: str = "epoch") -> dict:
    """Write the trace set and its sidecar manifest; return the manifest."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    ext = ".pt.trace.json.gz" if use_gzip else ".pt.trace.json"
    if single_file_mb:
        opts = [Options(0, ranks, seed, 1 << 62, int(single_file_mb * 1e6),
                        str(out / f"rank0{ext}"), use_gzip, orphan_flows, ts_origin)]
    else:
        per = -(-events // ranks)
        opts = [Options(r, ranks, seed, per, 1 << 62, str(out / f"rank{r}{ext}"), use_gzip,
                        orphan_flows, ts_origin) for r in range(ranks)]
    jobs = jobs or min(len(opts), os.cpu_count() or 1)
    t = time.perf_counter()
    if jobs > 1:
        with mp.get_context("fork").Pool(jobs) as pool:
            files = pool.map(_run_one, opts, chunksize=1)
    else:
        files = [_run_one(o) for o in opts]
    totals: dict[str, int] = {}
    for f in files:
        for k, v in f["counts"].items():
            totals[k] = totals.get(k, 0) + v
    manifest = {
        "generator": "benchmarks/gen_kineto.py",
        "params": {"ranks": ranks, "events": events, "single_file_mb": single_file_mb,
                   "gzip": use_gzip, "seed": seed, "orphan_flows": orphan_flows,
                   "ts_origin": ts_origin},
        "seconds": round(time.perf_counter() - t, 2),
        "total_events": sum(f["events"] for f in files),
        "total_json_bytes": sum(f["json_bytes"] for f in files),
        "total_file_bytes": sum(f["file_bytes"] for f in files),
        "counts": dict(sorted(totals.items())),
        "files": files,
    }
    Path(str(out).rstrip("/") + ".gen.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("outdir")
    p.add_argument("--ranks", type=int, default=8, help="ranks (files); also the world size")
    p.add_argument("--events", type=int, default=1_600_000, help="total events over all ranks")
    p.add_argument("--single-file-mb", type=float, default=None,
                   help="write one rank0 file of about this many MB (10^6 bytes) instead")
    p.add_argument("--gzip", action="store_true", help="write .json.gz")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=None, help="processes (default: min(ranks, cores))")
    p.add_argument("--no-orphan-flows", action="store_true",
                   help="omit the lone ac2g 'f' that Kineto writes on non-launching runtime calls")
    p.add_argument("--ts-origin", choices=("epoch", "base"), default="epoch",
                   help="epoch: absolute Unix us, baseTimeNanoseconds=0; base: relative to it")
    a = p.parse_args(argv)
    man = generate(a.outdir, a.ranks, a.events, a.single_file_mb, a.gzip, a.seed, a.jobs,
                   not a.no_orphan_flows, a.ts_origin)
    print(f"wrote {len(man['files'])} file(s) to {a.outdir}: {man['total_events']:,} events, "
          f"{man['total_json_bytes'] / 1e6:,.1f} MB JSON, {man['total_file_bytes'] / 1e6:,.1f} MB "
          f"on disk, in {man['seconds']} s", file=sys.stderr)
    for k, v in man["counts"].items():
        print(f"  {k:28s} {v:>10,}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
