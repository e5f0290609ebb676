# chorus: the two commands. Both install what is missing (Debian 12, as root), configure, build.
#   make demo   -> the main job
#   make test   -> every test, once at least (the ASan+UBSan build runs nearly all of them and
#                  the fuzz targets; the plain build what it alone can run and a smoke set;
#                  the TSan build the threaded ones), ending with
#                  "N passed, N failed"
#   make fuzz   -> every fuzz target for FUZZ_SECONDS (default 60) each
BUILD ?= build
MESON_FLAGS ?=
# The sanitizer builds (README "Tests, sanitizers and fuzzing"). No CUDA in them:
# there is no GPU in CI, and the plain build compiles the CUDA code.
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
# Nor the PyTorch backend: the plain build runs its tests (torch is not built with a sanitizer).
# -O1, as the sanitizers' documentation advises: at -O3 the ASan build's compile jobs took 2421 s
# of the 2 cores, at -O1 1524 s (2026-11-26; the CI run is limited to 30 minutes).
SAN_MESON_FLAGS := -Dcuda=disabled -Dtorch=disabled -Db_lundef=false -Doptimization=1
CLANG := clang-14
CLANGXX := clang++-14
# The sanitizer builds link with lld: a test program's link took 0.9 s with GNU ld, 0.2 s with
# lld (in the clean-clone runs of 2026-11-27 the TSan build went 197 -> 185 s; the ASan+UBSan
# build did not change measurably: those links waited more than they computed). The package
# `lld`, not `lld-14`: clang-14 looks for /usr/bin/ld.lld, which only the former installs.
SAN_LD := CC_LD=lld CXX_LD=lld
# What runs under TSan (fnmatch patterns of meson test names, !pattern excludes): the transport,
# comm and multi-rank DDP tests, and the DDP data loader (a prefetch thread). Not the variables
# strictness (collectives_env: 49 s there, no threads of ours to race). Not the two that
# only move a lot of data (2^31-byte send/recv; the type x op x ranks matrix): the plain and
# ASan+UBSan builds run them, and under TSan they would take 5 minutes of the 30; nor the
# deterministic-mode matrix (2..6 ranks), of which TSan runs the light case
# (collectives_deterministic_light: 3 ranks, both ordered algorithms, tcp, 2 channels). Nor the C
# API's exception test: it replaces operator new, which TSan's runtime defines too. DDP's
# equivalence without its OpenBLAS kernel families and its 4- and 5-rank matrix
# (ddp_equivalence_light: the same runs again under each GEMM, and on more ranks: numbers, which
# the plain build checks).
TSAN_TESTS ?= transport_*,collectives_*,!collectives_large,!collectives_reductions,\
  !collectives_deterministic,!collectives_c_api_exceptions,!collectives_env,ddp_distributed,ddp_equivalence_light,\
  ddp_restart,ddp_data,adversarial_teardown,adversarial_setup,adversarial_store
# Under ASan+UBSan everything, the fuzz targets included, except the qemu run (emulating ASan's
# shadow memory takes qemu-user past the test's 4-minute limit for test_reduce alone; the plain
# build's qemu run covers the CPU without AVX-512), the whole elastic-training set (7 minutes
# there; its light three run), the deterministic matrix (its light case runs), the three
# namespace hosts (51 s there) and the type x op x ranks matrix (70 s there; the kernels' own
# tests check the reductions under UBSan), and DDP's equivalence under each OpenBLAS kernel
# family and on 4 and 5 ranks (ddp_equivalence_light runs the rest): the plain build runs those. The CI run's 30 minutes.
ASAN_TESTS ?= *,!kernels/qemu_no_avx512,!ddp_elastic,!collectives_deterministic,\
  !launch_three_hosts_netns,!collectives_reductions,!ddp_equivalence
# In the plain build (as users build it, -O3, CUDA and the PyTorch backend in): what only it
# runs -- the six above, the torch and [cuda] tests, the checks of resident memory and
# address-space limits in adversarial_store/_handshake, which the sanitizers' allocators defeat
# -- and a smoke set of every layer at full speed (the kernels, collectives, DDP, launchers,
# tools, bench). The rest runs under ASan+UBSan only: running the whole suite in both builds
# took the CI run to 38 minutes of its 30 (2026-11-26). `make test-plain` runs all of it here.
PLAIN_TESTS ?= kernels/*,cuda_*,collectives_deterministic,collectives_ops,collectives_exchange,\
  collectives_reductions,\
  ddp_elastic,ddp_distributed,ddp_equivalence,ddp_train_cnn_output,ddp_cuda_ops,train_cnn_*,\
  launch_*,adversarial_store,adversarial_handshake,torch/*,bench/*,tools/*,lint/*
FUZZ_SECONDS ?= 60
PACKAGES := meson ninja-build gcc g++ pkg-config python3 catch2 libfmt-dev libcli11-dev \
            nlohmann-json3-dev openmpi-bin libopenmpi-dev libbenchmark-dev \
            libopenblas-dev libhwloc-dev libibverbs-dev zlib1g-dev iproute2 procps dataset-fashion-mnist qemu-user \
            clang-14 libclang-rt-14-dev lld clang-format-14 gdb
# The PyTorch backend (python/chorus_torch) and its tests: installed without recommends.
TORCH_PACKAGES := python3-torch libtorch-dev pybind11-dev

.PHONY: all deps build demo test test-plain fuzz chaos clean format

all: build

# Installs what is missing of a package list: $(call install,PACKAGES,APT_FLAGS)
define install
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  if [ "$$(id -u)" != 0 ]; then echo "error: need root to install: $$missing" >&2; exit 1; fi; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q $(2) $$missing >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q $(2) $$missing; }; \
	fi
endef

deps:
	$(call install,$(PACKAGES),)
	$(call install,$(TORCH_PACKAGES),--no-install-recommends)

$(BUILD)/build.ninja:
	meson setup $(BUILD) $(MESON_FLAGS)

# clang's ASan+UBSan (UBSan fatal: meson.build adds -fno-sanitize-recover=all). clang rather
# than gcc: it compiles sanitized code about 3 times faster here, and its UBSan checks more.
# With libFuzzer's coverage (-Dfuzz=true), so that this build also has the fuzz targets: a build
# of their own cost the CI run 250 s.
$(ASAN_BUILD)/build.ninja: | deps
	CC=$(CLANG) CXX=$(CLANGXX) $(SAN_LD) meson setup $(ASAN_BUILD) $(SAN_MESON_FLAGS) -Db_sanitize=address,undefined \
	  -Dfuzz=true

# clang's TSan.
$(TSAN_BUILD)/build.ninja: | deps
	CC=$(CLANG) CXX=$(CLANGXX) $(SAN_LD) meson setup $(TSAN_BUILD) $(SAN_MESON_FLAGS) -Db_sanitize=thread

# Everything but the test programs: meson puts them in ninja's "all" through meson-test-prereq even
# when they are not built by default (tests/meson.build), so that target is left out here; each
# test stage then builds the programs its tests run (tests/run_all.py). The plain build runs
# fewer than half of them: ~250 s of the CI run's 2 cores not spent.
build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD) build.ninja
	ninja -C $(BUILD) $$(ninja -C $(BUILD) -t query all | \
	  awk '/^  input:/ {f = 1; next} /^  outputs:/ {f = 0} f && $$1 != "meson-test-prereq" {print $$1}')

demo: build
	bash examples/demo.sh $(BUILD)

# Everything, one total line. Each stage builds what its tests need (tests/run_all.py).
test: build $(ASAN_BUILD)/build.ninja $(TSAN_BUILD)/build.ninja
	python3 tests/run_all.py --stage '$(BUILD)=$(PLAIN_TESTS)' --stage '$(ASAN_BUILD)=$(ASAN_TESTS)' \
	  --stage '$(TSAN_BUILD)=$(TSAN_TESTS)'

# The plain build's suite alone.
test-plain: build
	python3 tests/run_all.py $(BUILD)

# Elastic training under random kills (rank, step, after or inside it) for CHAOS_SECONDS.
CHAOS_SECONDS ?= 300
chaos: build
	python3 tests/ddp/test_elastic.py $(BUILD)/tools/chorus-run $(BUILD)/examples/train_cnn \
	  --chaos $(CHAOS_SECONDS)

fuzz: deps $(ASAN_BUILD)/build.ninja
	CHORUS_FUZZ_SECONDS=$(FUZZ_SECONDS) python3 tests/run_all.py --stage '$(ASAN_BUILD)=fuzz/*'

format:
	git ls-files '*.h' '*.cc' '*.c' '*.hpp' '*.cu' | xargs clang-format-14 -i

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
