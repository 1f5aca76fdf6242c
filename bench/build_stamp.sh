# Sourced by bench/prebuild_device.sh and bench/device_run.sh. build_stamp prints what decides
# whether a build of the tree in the current folder can be reused: the build inputs' contents,
# the Python and torch it is for, and the CUDA architectures. The device run uses a prebuilt
# extension only where its stamp equals the one it computes there, and builds otherwise.
build_stamp() {  # [python]
  local py=${1:-python3}
  find csrc python CMakeLists.txt setup.py pyproject.toml -type f ! -path '*/__pycache__/*' \
    ! -path '*.egg-info/*' ! -name '*.so' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
  "$py" -c "import sys, torch; print('python', *sys.version_info[:2], 'torch', torch.__version__, torch.version.git_version)"
  echo "arch ${TORCH_CUDA_ARCH_LIST:-9.0}"
}
