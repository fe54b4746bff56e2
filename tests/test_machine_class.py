from helpers import machine_class

FP = {"cpu_model": "Fake CPU", "physical_cores": 4, "bf16": {"avx2": True, "avx512": True, "native_bf16": False,
                                                             "amx": False}, "versions": {"torch": "2.8.0"}}


def test_hardware_class_and_machine_key():
    assert machine_class.hardware_class(FP) == "CPU 4 cores, AVX-512"
    assert machine_class.isa_class({"bf16": {"amx": True}}) == "AMX"
    assert machine_class.isa_class({}) == "unknown ISA"
    assert machine_class.hardware_class({"accelerators": ["NVIDIA H100", "NVIDIA H100"]}) == "2x NVIDIA H100"
    assert machine_class.machine_key({"machine_id": "abc"}) == "abc"
    key = machine_class.machine_key(FP)
    assert key == machine_class.machine_key(dict(FP)) and key.startswith("hw-")
