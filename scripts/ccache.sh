# Sourced by the build scripts: sets `launcher` to CMake's compiler-launcher arguments.
# ccache makes rebuilds fast; the sloppiness settings let it cache translation units that
# use the precompiled header. The base directory (the checkout) and the build's
# -ffile-prefix-map of it let a clone at another path (CI's) hit what this checkout
# compiled, but for the units whose command line defines a path of the checkout: 28 of 48
# Debian units hit in a clone (21 before); the 20 that missed were the tests', which since
# take their paths from a generated source (tests/build_paths.h; not measured again).
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
