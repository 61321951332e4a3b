"""The page of `stowage bench --report DIR`, drawn with matplotlib (Debian's
python3-matplotlib, run by /usr/bin/python3): reads DIR/report.json's charts (as
bench/lib/report.cpp's report_charts builds them) and writes DIR/index.html, one inline
SVG a chart. `--check` only imports matplotlib, so that a run fails before it starts."""
import html
import io
import json
import sys
import textwrap
import time

try:
    import matplotlib
except ImportError:
    sys.exit(f"bench report: {sys.executable} has no matplotlib (Debian's python3-matplotlib; "
             "scripts/setup.sh installs it)")

matplotlib.use("svg")
matplotlib.rcParams["svg.fonttype"] = "none"  # text as text, not glyph paths
matplotlib.rcParams["svg.hashsalt"] = "stowage"  # the same ids on every run
import matplotlib.pyplot as plt  # noqa: E402

ROLE_COLOURS = {"stowage": "#1f77b4", "pytorch": "#ff7f0e", "libtorch": "#8c8c8c"}
ROLE_NAMES = {"stowage": "stowage", "pytorch": "PyTorch (Python)", "libtorch": "LibTorch / unwrapped"}
LIMIT_COLOUR = "#d62728"
CURVE_COLOURS = ["#8c8c8c", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"]
TARGETS_AXIS = 3  # the targets chart cuts its bars at 3x their limit

# The groups of the marks the page's check counts (report.json's "marks"): a bar must have
# width and height, a line either.
AREA_MARK, LINE_MARK = "stowage-area-mark", "stowage-line-mark"


def mark(artist, gid):
    artist.set_gid(gid)
    return artist


def dashed(colour, dashes):
    return plt.Line2D([], [], color=colour, linestyle=(0, dashes), linewidth=2)


def bars(ax, chart):
    roles, limits = set(), set()
    for g, group in enumerate(chart["groups"]):
        n = len(group["bars"])
        width = min(0.8 / n, 0.3)
        left = g - width * n / 2
        for b, bar in enumerate(group["bars"]):
            x = left + width * (b + 0.5)
            roles.add(bar["role"])
            mark(ax.bar(x, bar["value"], width * 0.9, color=ROLE_COLOURS[bar["role"]])[0], AREA_MARK)
            ax.annotate(f"{bar['value']:.3g}", (x, bar["value"]), ha="center", va="bottom", fontsize=7)
            # A word a line, so that the labels of bars side by side stay apart.
            ax.annotate(bar["label"].replace(" ", "\n"), (x, 0), xytext=(0, -3), textcoords="offset points",
                        ha="center", va="top", fontsize=6, color="#555")
        if "limit" in group:
            limits.add(group["limit"]["label"])
            mark(ax.hlines(group["limit"]["value"], left - 0.05, left + width * n + 0.05, colors=LIMIT_COLOUR,
                           linestyles=(0, (6, 3)), linewidth=2), LINE_MARK)
    ax.set_xlim(-0.5, len(chart["groups"]) - 0.5)
    # Wrapped, so that the long labels of groups side by side stay apart.
    ax.set_xticks(range(len(chart["groups"])), ["\n".join(textwrap.wrap(g["label"], 24)) for g in chart["groups"]],
                  fontweight="bold")
    ax.tick_params(axis="x", pad=28, length=0)
    ax.set_ylabel(chart["unit"])
    present = [role for role in ROLE_COLOURS if role in roles]
    handles = [plt.Rectangle((0, 0), 1, 1, color=ROLE_COLOURS[role]) for role in present]
    handles += [dashed(LIMIT_COLOUR, (5, 3)) for _ in sorted(limits)]
    labels = [ROLE_NAMES[role] for role in present] + sorted(limits)
    ax.legend(handles, labels, loc="lower left", bbox_to_anchor=(0, 1.02), ncol=len(labels), fontsize=7,
              frameon=False)


def targets(ax, chart):
    rows = chart["rows"]
    for i, row in enumerate(rows):
        shown = min(row["relative"], TARGETS_AXIS)
        mark(ax.barh(i, shown, 0.7, color="#2ca02c" if row["met"] else LIMIT_COLOUR)[0], AREA_MARK)
        ax.annotate(f"{row['value']:.3g} ({row['relation']} {row['limit']:g})", (max(shown, 1), i), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=7)
    mark(ax.axvline(1, color="#333", linestyle=(0, (4, 3)), linewidth=2), LINE_MARK)
    ax.set_yticks(range(len(rows)), [row["label"] for row in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, TARGETS_AXIS)
    ax.set_xticks(range(TARGETS_AXIS + 1), [f"{t}x" for t in range(TARGETS_AXIS + 1)])
    ax.set_xlabel("measured / the target's limit")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour) for colour in ("#2ca02c", LIMIT_COLOUR)]
    ax.legend(handles + [dashed("#333", (4, 3))], ["met", "not met", "the target's limit"], loc="lower left",
              bbox_to_anchor=(0, 1.0), ncol=3, fontsize=7, frameon=False)


def lines(ax, chart):
    for i, series in enumerate(chart["series"]):
        x, y = zip(*series["points"])
        # Steps, not slopes: a sample is the most bytes allocated since the previous one, so its
        # value holds over the whole interval before it.
        mark(ax.step(x, y, where="pre", color=CURVE_COLOURS[i % 5], linewidth=2, label=series["label"])[0],
             LINE_MARK)
    ax.set_xlabel(f"time since the step began, {chart['x_unit']}")
    ax.set_ylabel(chart["unit"])
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), fontsize=7, frameon=False)


def chart_svg(chart):
    rows = len(chart.get("rows", []))
    fig, ax = plt.subplots(figsize=(7.2, 0.25 * rows + 1.2 if rows else 3.6))
    {"bars": bars, "targets": targets, "lines": lines}[chart["kind"]](ax, chart)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="x" if chart["kind"] == "targets" else "y", color="#e0e0e0")
    ax.set_axisbelow(True)
    out = io.StringIO()
    # No metadata: it names matplotlib's site, and the page links to nothing.
    fig.savefig(out, format="svg", bbox_inches="tight",
                metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    plt.close(fig)
    svg = out.getvalue()
    svg = svg[svg.index("<svg"):]  # no XML declaration or doctype inside the page
    for gid, kind in ((AREA_MARK, "area"), (LINE_MARK, "line")):
        svg = svg.replace(f'<g id="{gid}">', f'<g class="mark {kind}">')
    return svg.replace("<svg ", f'<svg id="{html.escape(chart["id"])}" class="chart" ', 1)


STYLE = """<style>
body { font-family: sans-serif; margin: 24px; color: #222; }
main { display: flex; flex-wrap: wrap; gap: 8px 40px; }
figure { margin: 0 0 24px 0; max-width: 720px; }
figcaption { color: #555; font-size: 13px; margin-top: 4px; }
h2 { margin-top: 32px; border-bottom: 1px solid #ddd; }
pre { font-size: 11px; color: #777; white-space: pre-wrap; }
</style>"""

# Run by the browser once the page is laid out: for each chart, how many of its marks have a
# nonzero size, written into #chart-check as JSON (tests/cli/report_test.cpp reads it).
CHECK_SCRIPT = """<script>
(function () {
  var result = {};
  document.querySelectorAll('svg.chart').forEach(function (svg) {
    var marks = svg.querySelectorAll('.mark > path'), drawn = 0;
    marks.forEach(function (mark) {
      var box = mark.getBBox();
      var sized = mark.parentNode.classList.contains('area') ? box.width > 0 && box.height > 0
                                                              : box.width > 0 || box.height > 0;
      if (sized) drawn++;
    });
    var box = svg.getBoundingClientRect();
    result[svg.id] = {marks: marks.length, drawn: drawn, width: box.width, height: box.height};
  });
  document.getElementById('chart-check').textContent = JSON.stringify(result);
})();
</script>"""


def page(charts):
    figures = "".join(f"<figure><h3>{html.escape(chart['title'])}</h3>{chart_svg(chart)}"
                      f"<figcaption>{html.escape(chart.get('note', ''))}</figcaption></figure>\n" for chart in charts)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>stowage bench report</title>"
            f"{STYLE}</head><body>\n<h1>stowage bench report</h1>\n"
            f"<p>{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: every figure of one run of <code>stowage "
            "bench</code> beside its peer, measured in the same run, and its limit or target. Every number is in "
            f"report.json.</p>\n<main>\n{figures}</main>\n<h2>Render check</h2><pre id=\"chart-check\">not run</pre>\n"
            f"{CHECK_SCRIPT}\n</body></html>\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(0)
    directory = sys.argv[1]
    with open(f"{directory}/report.json") as f:
        charts = json.load(f)["charts"]
    with open(f"{directory}/index.html", "w") as f:
        f.write(page(charts))
