# Build facts compiled into the native module (csrc/build_info.h, tokensampler.build_info()):
# the package version (pyproject.toml, its single source), the torch it is built against, the
# CUDA toolkit and the architectures nvcc generates code for. Included after find_package(Torch),
# whose CUDA setup turns TORCH_CUDA_ARCH_LIST into -gencode flags in CMAKE_CUDA_FLAGS.

file(STRINGS "${CMAKE_CURRENT_SOURCE_DIR}/pyproject.toml" _ts_version_line
     REGEX "^version = \"[^\"]+\"$" LIMIT_COUNT 1)
string(REGEX REPLACE "^version = \"([^\"]+)\"$" "\\1" TOKENSAMPLER_VERSION "${_ts_version_line}")
if(NOT TOKENSAMPLER_VERSION)
  message(FATAL_ERROR "no `version = \"...\"` line in pyproject.toml")
endif()

execute_process(
  COMMAND "${Python_EXECUTABLE}" -c "import torch; print(torch.__version__); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _ts_torch_out OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
string(REPLACE "\n" ";" _ts_torch_out "${_ts_torch_out}")
list(GET _ts_torch_out 0 TOKENSAMPLER_TORCH_VERSION)
list(LENGTH _ts_torch_out _ts_n)
set(TOKENSAMPLER_TORCH_CUDA_VERSION "")
if(_ts_n GREATER 1)
  list(GET _ts_torch_out 1 TOKENSAMPLER_TORCH_CUDA_VERSION)
endif()

# sm_XY the fat binary holds machine code for, and compute_XY it holds PTX of, as nvcc is told
# them: "-gencode arch=compute_90,code=sm_90", "...,code=[sm_120,compute_120]",
# "...,code=compute_120".
set(TOKENSAMPLER_CUDA_ARCHS "")
set(TOKENSAMPLER_CUDA_PTX "")
set(TOKENSAMPLER_CUDA_VERSION "")
if(TOKENSAMPLER_CUDA)
  string(REGEX MATCHALL "code=(\\[[^]]*\\]|[a-z_0-9]+)" _ts_codes "${CMAKE_CUDA_FLAGS}")
  foreach(_code IN LISTS _ts_codes)
    string(REGEX MATCHALL "(sm|compute)_[0-9]+[af]?" _targets "${_code}")
    foreach(_target IN LISTS _targets)
      if(_target MATCHES "^sm_")
        list(APPEND TOKENSAMPLER_CUDA_ARCHS "${_target}")
      else()
        list(APPEND TOKENSAMPLER_CUDA_PTX "${_target}")
      endif()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES TOKENSAMPLER_CUDA_ARCHS)
  list(REMOVE_DUPLICATES TOKENSAMPLER_CUDA_PTX)
  if(NOT TOKENSAMPLER_CUDA_ARCHS AND NOT TOKENSAMPLER_CUDA_PTX)
    message(FATAL_ERROR "no -gencode target in CMAKE_CUDA_FLAGS: ${CMAKE_CUDA_FLAGS}")
  endif()
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" TOKENSAMPLER_CUDA_VERSION "${CMAKE_CUDA_COMPILER_VERSION}")
endif()
message(STATUS "tokensampler ${TOKENSAMPLER_VERSION}: torch ${TOKENSAMPLER_TORCH_VERSION}, "
               "CUDA '${TOKENSAMPLER_CUDA_VERSION}', archs '${TOKENSAMPLER_CUDA_ARCHS}', "
               "PTX '${TOKENSAMPLER_CUDA_PTX}'")

# Lists travel as comma-separated strings.
string(REPLACE ";" "," _ts_archs "${TOKENSAMPLER_CUDA_ARCHS}")
string(REPLACE ";" "," _ts_ptx "${TOKENSAMPLER_CUDA_PTX}")
set(TOKENSAMPLER_BUILD_INFO_DEFINITIONS
  "TOKENSAMPLER_VERSION=\"${TOKENSAMPLER_VERSION}\""
  "TOKENSAMPLER_TORCH_VERSION=\"${TOKENSAMPLER_TORCH_VERSION}\""
  "TOKENSAMPLER_TORCH_CUDA_VERSION=\"${TOKENSAMPLER_TORCH_CUDA_VERSION}\""
  "TOKENSAMPLER_CUDA_VERSION=\"${TOKENSAMPLER_CUDA_VERSION}\""
  "TOKENSAMPLER_CUDA_ARCHS=\"${_ts_archs}\""
  "TOKENSAMPLER_CUDA_PTX=\"${_ts_ptx}\"")
