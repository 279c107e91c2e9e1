# Sourced by scripts/test.sh and the gpu-*-check.sh scripts' `build` step: puts the NVRTC
# library from the PyPI package nvidia-cuda-nvrtc-cu12 on LD_LIBRARY_PATH, or exits saying how
# to install it.
nvrtc_dir=$(python3 -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib"))' 2>/dev/null) || {
  echo "NVRTC missing: python3 -m pip install 'nvidia-cuda-nvrtc-cu12==12.*'" >&2; exit 1; }
export LD_LIBRARY_PATH="$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
