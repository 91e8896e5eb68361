"""The node floor's health readers: the kernel log (journalctl's short-monotonic and dmesg's
lines, the fallback from one to the other), InfiniBand ports, a running process."""

from gpuenv.floor import health

JOURNAL = (
    "[   11.380447] node-a kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.127.05\n"
    "[51234.551208] node-a kernel: NVRM: Xid (PCI:0000:5D:00): 79, pid=0,"
    " GPU has fallen off the bus.\n"
    "[ 1843.308145] node-a kernel: nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal,"
    " Link 32 egress non-posted PRIV error (First)\n"
)
DMESG = (
    "[430954.533994] NVRM: Xid (PCI:0000:52:00): 94, pid='<unknown>', name=<unknown>,"
    " Contained: SM (0x1). RST: No, D-RST: No\n"
)


def test_xid_and_sxid_lines_are_parsed_with_their_stamp():
    events = health.parse_kernel_log(JOURNAL + DMESG)
    assert [(e.kind, e.code, e.bus, e.since_boot_s) for e in events] == [
        ("xid", 79, "0000:5d:00", 51234.551208),
        ("sxid", 12028, "0000:05:00.0", 1843.308145),
        ("xid", 94, "0000:52:00", 430954.533994),
    ]
    assert events[0].text == "pid=0, GPU has fallen off the bus."


def test_a_line_without_a_stamp_is_kept():
    (event,) = health.parse_kernel_log("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper\n")
    assert event.code == 63 and event.since_boot_s == -1.0


def test_the_kernel_log_falls_back_to_dmesg_and_says_when_neither_answers():
    calls = []

    def no_journal(argv, timeout_s=0.0):
        calls.append((argv[0], timeout_s))
        return (127, "") if argv[0] == "journalctl" else (0, DMESG)

    log = health.kernel_log(no_journal)
    assert log.source == "dmesg" and [e.code for e in log.events] == [94]
    assert calls == [
        ("journalctl", health.KERNEL_LOG_TIMEOUT_S),
        ("dmesg", health.KERNEL_LOG_TIMEOUT_S),
    ]
    log = health.kernel_log(lambda argv, timeout_s=0.0: (1 if argv[0] == "dmesg" else 124, ""))
    assert log.source == "" and log.reason == "journalctl: exit 124; dmesg: exit 1"


def test_ib_ports_and_their_counters(tmp_path):
    port = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    (port / "counters").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (port / "counters/symbol_error").write_text("7\n")
    (port / "counters/port_rcv_data").write_text("123456\n")  # traffic, not an error
    (found,) = health.ib_ports(str(tmp_path))
    assert (found.name, found.state, found.phys_state) == ("mlx5_0/1", "ACTIVE", "LinkUp")
    assert found.counters == {"symbol_error": 7}
    assert health.ib_ports(str(tmp_path / "none")) == []


def test_module_version_boot_and_processes(tmp_path):
    assert health.module_version(str(tmp_path)) is None
    (tmp_path / "sys/module/nvidia").mkdir(parents=True)
    (tmp_path / "sys/module/nvidia/version").write_text("580.159.04\n")
    assert health.module_version(str(tmp_path)) == "580.159.04"
    (tmp_path / "proc/77").mkdir(parents=True)
    (tmp_path / "proc/77/comm").write_text("nv-fabricmanager\n")
    (tmp_path / "proc/uptime").write_text("3600.50 100.0\n")
    assert health.running(str(tmp_path)) and health.uptime_s(str(tmp_path)) == 3600.5
