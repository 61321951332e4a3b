# Sourced by the build scripts: sets `launcher` to CMake's compiler-launcher arguments.
# ccache makes rebuilds fast; the sloppiness settings let it cache translation units that
# use the precompiled header. The base directory would let clones in other folders share
# the cache, but CMake 3.25's unity batches #include their sources by absolute path, and
# the precompiled header names its header so too: a clone elsewhere (CI's) hits only for
# what a checkout in the same folder compiled before.
# The cache lives outside the checkout, beside the Python environment
# (scripts/python_env.sh), and holds both LibTorchs' builds.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/stowage/ccache}
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-16G}
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  export CCACHE_BASEDIR="$root"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
