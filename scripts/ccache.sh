# Sourced by the build scripts: sets `launcher` to CMake's compiler-launcher arguments.
# ccache makes rebuilds and CI runs on a warm machine fast; the sloppiness settings let it
# cache translation units that use the precompiled header, and the base directory lets
# clones in other folders share the cache. The cache lives outside the checkout, beside
# the Python environment (scripts/python_env.sh), and holds both LibTorchs' builds.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/stowage/ccache}
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-16G}
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  export CCACHE_BASEDIR="$root"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
