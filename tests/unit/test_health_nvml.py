"""The nvidia-ml-py backend, against a fake ``pynvml`` module that answers in pynvml's own shapes
(lists, ctypes-like structs, milliwatts, NVMLError for what a GPU does not support): it must
read the same GpuReadings the fixtures' FakeNvml gives, so the fixtures stand for real NVML."""

from types import SimpleNamespace

import pytest
from healthnode import build

from gpuenv.health.nvml import FABRIC_STATES, NVLINK_COUNTERS, FakeNvml, PynvmlNvml


class NVMLError(Exception):
    pass


class FakePynvml:
    """The pynvml calls PynvmlNvml makes, answering from fixture data; counts the calls."""

    NVMLError = NVMLError

    def __init__(self, reading):
        self.r = reading
        self.calls = 0
        self.open = False

    def _gpu(self, h):
        self.calls += 1
        return self.r.gpus[h]

    @staticmethod
    def _given(value):
        if value is None:
            raise NVMLError("Not Supported")
        return value

    def nvmlInit(self):
        self.open = True

    def nvmlShutdown(self):
        self.open = False

    def nvmlSystemGetDriverVersion(self):
        return self.r.driver_version

    def nvmlDeviceGetCount(self):
        return len(self.r.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        assert self.open
        return i

    def nvmlDeviceGetName(self, h):
        return self._gpu(h).name.encode()  # older nvidia-ml-py answers bytes

    def nvmlDeviceGetUUID(self, h):
        return self._gpu(h).uuid

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=("0000" + self._gpu(h).bus_id).upper())

    def nvmlDeviceGetEccMode(self, h):
        g = self._gpu(h)
        return [int(self._given(g.ecc_current)), int(g.ecc_pending)]

    def nvmlDeviceGetTotalEccErrors(self, h, err, counter):
        g = self._gpu(h)
        scope = ("volatile", "aggregate")[counter]
        kind = ("corrected", "uncorrected")[err]
        return self._given(getattr(g, f"ecc_{scope}_{kind}"))

    def nvmlDeviceGetRetiredPages(self, h, cause):
        n = self._given((self._gpu(h).retired_sbe, self._gpu(h).retired_dbe)[cause])
        return [0x1000 * i for i in range(n)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return int(self._given(self._gpu(h).retired_pending))

    def nvmlDeviceGetRemappedRows(self, h):
        g = self._gpu(h)
        self._given(g.remap_pending)
        return (g.remap_correctable, g.remap_uncorrectable, int(g.remap_pending),
                int(g.remap_failure))  # fmt: skip

    def nvmlDeviceGetRowRemapperHistogram(self, h):
        return SimpleNamespace(**self._given(self._gpu(h).remap_histogram))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._given(self._gpu(h).clock_reasons)

    def nvmlDeviceGetViolationStatus(self, h, policy):
        g = self._gpu(h)
        value = (g.violation_power_ns, g.violation_thermal_ns)[policy]
        return SimpleNamespace(referenceTime=123, violationTime=self._given(value))

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._given(self._gpu(h).temperature_c)

    def nvmlDeviceGetTemperatureThreshold(self, h, kind):
        g = self._gpu(h)
        return self._given((g.shutdown_c, g.slowdown_c)[kind])

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self._given(self._gpu(h).utilization_pct), memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        g = self._gpu(h)
        used, total = self._given(g.memory_used_mib), self._given(g.memory_total_mib)
        return SimpleNamespace(used=int(used * 2**20), total=int(total * 2**20), free=0)

    def nvmlDeviceGetPowerUsage(self, h):
        return round(self._given(self._gpu(h).power_w) * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return round(self._given(self._gpu(h).power_limit_w) * 1000)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._given(self._gpu(h).pcie_gen)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._given(self._gpu(h).pcie_max_gen)

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._given(self._gpu(h).pcie_width)

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._given(self._gpu(h).pcie_max_width)

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return self._given(self._gpu(h).pcie_replays)

    def _link(self, h, link):
        links = {x.link: x for x in self._given(self._gpu(h).nvlinks)}
        return self._given(links.get(link))

    def nvmlDeviceGetNvLinkState(self, h, link):
        return int(self._link(h, link).active)

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        name = {v: k for k, v in NVLINK_COUNTERS.items()}[counter]
        return self._given(self._link(h, link).counters.get(name))

    def nvmlDeviceGetPersistenceMode(self, h):
        return int(self._given(self._gpu(h).persistence))

    def nvmlDeviceGetMigMode(self, h):
        g = self._gpu(h)
        return [int(self._given(g.mig_current)), int(g.mig_pending)]

    # nvidia-ml-py 13: the caller hands in the struct, the call fills it and answers NVML_SUCCESS.
    c_nvmlGpuFabricInfo_t = SimpleNamespace

    @staticmethod
    def byref(struct):
        return struct

    def nvmlDeviceGetGpuFabricInfo(self, h, info):
        g = self._gpu(h)
        info.state = {v: k for k, v in FABRIC_STATES.items()}[self._given(g.fabric_state)]
        info.status = 0 if g.fabric_status == "success" else 6
        return 0


@pytest.mark.parametrize("base", ["hgx8", "v100x4"])
def test_pynvml_backend_reads_what_the_fixture_says(tmp_path, base):
    want = FakeNvml(build(tmp_path, base).nvml_data).read()
    fake = FakePynvml(want)
    got = PynvmlNvml(fake).read()
    assert got == want
    assert not fake.open  # NVML closed again
    # Few calls: the whole node's reading is a few dozen calls a GPU (the speed target).
    per_gpu = fake.calls / len(want.gpus)
    assert per_gpu < 140, per_gpu


def test_nvml_that_cannot_start_is_said(tmp_path):
    class Broken(FakePynvml):
        def nvmlInit(self):
            raise NVMLError("Driver Not Loaded")

    got = PynvmlNvml(Broken(None)).read()
    assert got.gpus == [] and "Driver Not Loaded" in got.error


def test_a_gpu_nvml_cannot_open_is_named(tmp_path):
    reading = FakeNvml(build(tmp_path, "hgx8").nvml_data).read()

    class OneBad(FakePynvml):
        def nvmlDeviceGetHandleByIndex(self, i):
            if i == 4:
                raise NVMLError("GPU requires reset")
            return i

    got = PynvmlNvml(OneBad(reading)).read()
    assert got.gpus[4].error == "GPU requires reset"
    assert got.gpus[3] == reading.gpus[3]


def test_every_call_matches_the_real_nvidia_ml_py(tmp_path):
    """The fake answers whatever it is asked; the real module must accept the same calls (a
    call with the wrong arguments would raise TypeError on a GPU node, not NVMLError)."""
    import inspect

    import pynvml  # nvidia-ml-py: a dependency of the node extra and of dev

    reading = FakeNvml(build(tmp_path, "hgx8").nvml_data).read()
    calls = set()

    class Recording(FakePynvml):
        def __getattribute__(self, name):
            value = object.__getattribute__(self, name)
            if name.startswith("nvml") and callable(value):

                def record(*args):
                    calls.add((name, len(args)))
                    return value(*args)

                return record
            return value

    PynvmlNvml(Recording(reading)).read()
    assert len(calls) > 20
    for name, nargs in sorted(calls):
        real = getattr(pynvml, name, None)
        assert real is not None, f"nvidia-ml-py has no {name}"
        inspect.signature(real).bind(*([None] * nargs))  # TypeError: the call would not fit
    assert pynvml.c_nvmlGpuFabricInfo_t and pynvml.byref


def test_the_numbers_the_backend_uses_are_nvidia_ml_py_s():
    import pynvml

    from gpuenv.health import nvml

    assert (
        pynvml.nvmlClocksEventReasonGpuIdle,
        pynvml.nvmlClocksEventReasonHwSlowdown,
        pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    ) == (nvml.REASON_GPU_IDLE, nvml.REASON_HW_SLOWDOWN, nvml.REASON_SW_THERMAL)
    assert (
        pynvml.nvmlClocksThrottleReasonHwThermalSlowdown,
        pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown,
    ) == (nvml.REASON_HW_THERMAL, nvml.REASON_HW_POWER_BRAKE)
    assert nvml.NVLINK_COUNTERS == {
        "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
        "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
        "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
        "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
    }
    # The literals of PynvmlNvml._gpu: error and counter types, retirement causes, thresholds.
    assert (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED) == (
        0,
        1,
    )
    assert (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC) == (0, 1)
    assert (
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    ) == (0, 1)
    assert (pynvml.NVML_PERF_POLICY_POWER, pynvml.NVML_PERF_POLICY_THERMAL) == (0, 1)
    assert (
        pynvml.NVML_TEMPERATURE_GPU,
        pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
        pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    ) == (0, 0, 1)
    assert nvml.FABRIC_STATES[pynvml.NVML_GPU_FABRIC_STATE_COMPLETED] == "completed"
