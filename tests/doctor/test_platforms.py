"""helpers.doctor.platforms: the platform's limits and the C++ compiler, judged from made-up facts
(a fake Linux aarch64, macOS and Windows included)."""

from helpers.doctor import platforms as doctor

LINUX = {"system": "Linux", "machine": "x86_64", "left_out": [], "ipex_wheels": True}


def test_compiler_each_platform_and_state():
    good = {"cxx_env": None, "cxx": "/usr/bin/g++", "version": "g++ 12.2.0", "include": "/inc", "python_h": True,
            "python": "3.11"}
    ok = doctor.check_compiler(good)
    assert ok.status == "ok" and "/usr/bin/g++" in ok.message and "from PATH" in ok.message
    assert "from $CXX" in doctor.check_compiler({**good, "cxx_env": "clang++", "cxx": "/usr/bin/clang++"}).message
    none = doctor.check_compiler({**good, "cxx": None})
    assert none.status == "fail" and "no C++ compiler" in none.message
    assert none.fix.startswith("Debian/Ubuntu: `sudo apt-get install g++ python3.11-dev`")
    assert "xcode-select --install" in doctor.check_compiler({**good, "cxx": None}, "Darwin").fix
    assert "WSL2" in doctor.check_compiler({**good, "cxx": None}, "Windows").fix
    shim = doctor.check_compiler({**good, "cxx": "/usr/bin/g++", "runs": False,
                                  "version": "xcrun: error: invalid active developer path"}, "Darwin")
    assert shim.status == "fail" and "does not run (xcrun" in shim.message and "xcode-select" in shim.fix
    stale = doctor.check_compiler({**good, "cxx_env": "g++-99", "cxx": None})
    assert stale.status == "fail" and "$CXX is 'g++-99'" in stale.message and "unset" in stale.fix
    headers = doctor.check_compiler({**good, "python_h": False, "python": "3.12"})
    assert headers.status == "fail" and "Python.h is missing from /inc" in headers.message
    assert "python3.12-dev" in headers.fix
    assert "brew install python@3.11" in doctor.check_compiler({**good, "python_h": False}, "Darwin").fix


def test_platform_limits_linux_x86_has_none():
    checks = doctor.check_platform(LINUX)
    assert [(c.name, c.status) for c in checks] == [("platform", "ok")] and "no platform limits" in checks[0].message
    assert "(WSL2)" in doctor.check_platform({**LINUX, "wsl": True})[0].message


def test_platform_limits_linux_aarch64(fake_platforms):
    checks = doctor.check_platform(fake_platforms["Linux aarch64"])
    by = {c.name: c for c in checks}
    assert list(by) == ["platform", "limit intel-openmp", "limit nni", "limit openvino"]
    assert by["platform"].status == "ok" and "Linux aarch64: the course runs with 3 limit(s)" in by["platform"].message
    assert "no OpenVINO wheel for Linux aarch64" in by["limit openvino"].message
    assert "chapter 14 measures eager PyTorch and ONNX Runtime only" in by["limit openvino"].message
    assert "chapter 06 computes the same L1-norm masks with Torch-Pruning" in by["limit nni"].message
    assert "chapters 02 and 04 skip their Intel OpenMP arms" in by["limit intel-openmp"].message
    assert all(c.status == "warn" and c.fix for c in checks[1:])


def test_platform_limits_macos(fake_platforms):
    mac = fake_platforms["macOS arm64"]
    by = {c.name: c for c in doctor.check_platform(mac, ["mps"])}
    assert list(by) == ["platform", "limit intel-openmp", "limit nni", "limit LD_PRELOAD", "limit torchrun",
                        "limit mps"]
    assert "limit openvino" not in by  # OpenVINO has macOS arm64 wheels
    assert "jemalloc or tcmalloc" in by["limit LD_PRELOAD"].message and "02 and 04" in by["limit LD_PRELOAD"].message
    assert "gloo" in by["limit torchrun"].message
    assert by["limit mps"].message.startswith("Apple GPU (mps) found") and "CI does not run" in by["limit mps"].message
    assert "not found" in {c.name: c for c in doctor.check_platform(mac, [])}["limit mps"].message
    old = {c.name: c for c in doctor.check_platform({**mac, "macos": "13.6.1"})}
    assert "macOS 13.6.1" in old["limit macOS"].message and "14" in old["limit macOS"].fix


def test_platform_limits_windows_and_unknown(fake_platforms):
    by = {c.name: c for c in doctor.check_platform(fake_platforms["Windows x86-64"])}
    assert list(by) == ["platform", "limit intel-openmp", "limit windows"] and "WSL2" in by["limit windows"].fix
    assert "make" in by["limit windows"].message and "mpirun" in by["limit windows"].message
    odd = doctor.check_platform({"system": "Linux", "machine": "ppc64le", "left_out": ["openvino"]})
    assert odd[0].status == "warn" and "Linux ppc64le is not one of the platforms" in odd[0].message
    assert "make platforms" in odd[0].fix
    assert "some-new-pin is not installed on Linux x86-64" in doctor.check_platform(
        {"system": "Linux", "machine": "x86_64", "left_out": ["some-new-pin"]})[1].message
