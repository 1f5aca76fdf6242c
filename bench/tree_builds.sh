# Sourced by bench/prebuild_device.sh and bench/device_run.sh, which must agree on a variant's
# tree to the byte for a prebuilt build to be used: its name, its copy of the tree, its patches,
# and the stamp that decides whether a build can be reused.

# The name of a variant spec (file.patch[+file2.patch...]): its patches' names joined by '+'.
variant_name() {  # spec
  local patch_files f
  IFS='+' read -r -a patch_files <<< "$1"
  for f in "${patch_files[@]}"; do basename "$f" .patch; done | paste -sd+ -
}

# Copies the tree in the current folder (sources, tests, bench; no build outputs, environments
# or carried bundles) into folder $1.
copy_tree() {  # dest
  tar -cf - --exclude=./build --exclude=./.git --exclude=./.venv --exclude=./.devvenv \
    --exclude=./.devbuild --exclude=./bench/out --exclude=./.fi --exclude=./.xg --exclude=./shared \
    . | tar -xf - -C "$1"
}

# Applies a spec's patches to folder $1 in order: patch(1) where the machine has it, else git
# apply (which needs no repository). Fails at the first that does not apply.
apply_patches() {  # dir spec
  local patch_files f
  IFS='+' read -r -a patch_files <<< "$2"
  for f in "${patch_files[@]}"; do
    f=$(realpath "$f")
    if command -v patch > /dev/null; then
      (cd "$1" && patch -p1 -s --forward < "$f") || return 1
    else
      (cd "$1" && git apply "$f") || return 1
    fi
  done
}

# A build's stamp: the source_hash of the tree in the current folder, then build_env's output
# ($1, computed once a call), one a line. Both scripts write and compare stamps only through it.
build_stamp() {  # build_env
  printf '%s\n%s' "$(source_hash)" "$1"
}
# The build inputs' contents in the current folder.
source_hash() {
  find csrc python CMakeLists.txt setup.py pyproject.toml -type f ! -path '*/__pycache__/*' \
    ! -path '*.egg-info/*' ! -name '*.so' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}
# The Python and torch a build is for, and the CUDA architectures: one per call (it imports
# torch, so callers compute it once).
build_env() {  # [python]
  "${1:-python3}" -c "import sys, torch; print('python', *sys.version_info[:2], 'torch', torch.__version__, torch.version.git_version)"
  echo "arch ${TORCH_CUDA_ARCH_LIST:-9.0}"
}
