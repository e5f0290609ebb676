# chorus: the two commands. Both install what is missing (Debian 12, as root), configure, build.
#   make demo   -> the main job
#   make test   -> every test, ending with "N passed, N failed"
BUILD ?= build
MESON_FLAGS ?=
PACKAGES := meson ninja-build gcc g++ pkg-config python3 catch2 libfmt-dev libspdlog-dev libcli11-dev \
            nlohmann-json3-dev libhwloc-dev openmpi-bin libopenmpi-dev libbenchmark-dev \
            libopenblas-dev zlib1g-dev iproute2 procps dataset-fashion-mnist qemu-user

.PHONY: all deps build demo test clean format

all: build

deps:
	@missing=$$(for p in $(PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  if [ "$$(id -u)" != 0 ]; then echo "error: need root to install: $$missing" >&2; exit 1; fi; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q $$missing >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q $$missing; }; \
	fi

$(BUILD)/build.ninja:
	meson setup $(BUILD) $(MESON_FLAGS)

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

demo: build
	bash examples/demo.sh $(BUILD)

test: build
	python3 tests/run_all.py $(BUILD)

format:
	git ls-files '*.h' '*.cc' '*.c' '*.hpp' '*.cu' | xargs clang-format -i

clean:
	rm -rf $(BUILD)
