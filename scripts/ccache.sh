# Sourced by the build scripts: sets `launcher` to CMake's compiler-launcher arguments.
# ccache makes rebuilds fast; the sloppiness settings let it cache translation units that
# use the precompiled header. The base directory (the checkout) and the build's
# -ffile-prefix-map of it let a clone at another path (CI's) hit what this checkout
# compiled, with one catch measured in docs/reliability.md ("CI"): gcc's precompiled
# header differs byte for byte from one compilation to the next, and ccache keys the units
# that use it on its bytes, so they hit only when the clone's header compilation does.
# The cache lives outside the checkout, beside the Python environment
# (scripts/python_env.sh), and holds both LibTorchs' builds.
launcher=()
if command -v ccache >/dev/null; then
  # The settings go into the launcher, not this shell's environment: a build run by hand
  # (`ninja -C build`) then fills the same cache as the scripts do, which is what a clone
  # hits (before, such builds went to ccache's default cache, and a clone of a commit built
  # that way missed: its wheel build took 525 s).
  ccache_settings=(
    "CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/stowage/ccache}"
    "CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-16G}"
    CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
    "CCACHE_BASEDIR=$root"
  )
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;$(IFS=';' && echo "${ccache_settings[*]}");ccache")
fi
