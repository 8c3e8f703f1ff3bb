# Plots the data files of `kvedge eval --plot-dir DIR` (quality_schemes.dat, quality_layers.dat)
# as quality_schemes.png and quality_layers.png. A missing data file is skipped.
#
#   gnuplot -e "data='DIR'; img='docs/img'; what='KJV cloud model'" scripts/plot_quality.gp
#
# Needs gnuplot with the pngcairo terminal (Debian: gnuplot-nox).
if (!exists("data")) data = "."
if (!exists("img")) img = "."
if (!exists("what")) what = "kvedge eval"

have(f) = int(system(sprintf("test -s '%s' && echo 1 || echo 0", f)))
# The first comment line of a data file: what was measured.
about(f) = system(sprintf("sed -n '1s/^# kvedge eval: //p' '%s'", f))

set terminal pngcairo size 1200,520 noenhanced font "sans,10"
set grid ytics lc rgb "#dddddd"
set datafile missing "nan"
set style fill solid 0.85 border -1
set boxwidth 0.7

# ---- the schemes: perplexity change (with the goals), KL and agreement
f = data."/quality_schemes.dat"
if (have(f)) {
    set output img."/quality_schemes.png"
    set multiplot layout 1,2 title what.": the cache schemes against full recomputation (".about(f).")"
    set xtics rotate by 35 right
    set key outside bottom center horizontal
    set ylabel "perplexity change vs lossless, %"
    set title "perplexity (lines: the goals of int8, 0.5 %, and int4-g32, 3 %)"
    set yrange [*:*]
    set offsets 0, 0, graph 0.1, 0
    plot f using 1:4:xtic(2) with boxes lc rgb "#4477aa" notitle, \
         f using 1:($4 > 0 ? $4 : 0):(sprintf("%+.2g", $4)) with labels offset 0, 0.7 \
             font ",8" notitle, \
         0.5 with lines dt 2 lc rgb "#228833" title "int8 goal", \
         3.0 with lines dt 2 lc rgb "#cc6677" title "int4-g32 goal"
    set title "distribution shift and greedy agreement"
    set ylabel "mean KL(reference || scheme), nats (log)"
    set logscale y
    set format y "%g"
    set yrange [*:*]
    set y2label "greedy next-token agreement"
    set y2range [0:1.05]
    set y2tics 0.1
    set ytics nomirror
    set offsets 0, 0, 0, 0
    plot f using 1:($6 > 0 ? $6 : 1/0):xtic(2) with boxes lc rgb "#66ccee" title "KL", \
         f using 1:5 axes x1y2 with linespoints pt 7 lc rgb "#aa3377" title "agreement"
    unset multiplot
    unset logscale y
    set format y "% h"
    unset y2label
    unset y2tics
    set ytics mirror
    set xtics norotate
}

# ---- the per-layer profile: one layer in the profile scheme, the others lossless
f = data."/quality_layers.dat"
if (have(f)) {
    hdr = system(sprintf("grep -m1 '^# layer' '%s'", f))
    np = (words(hdr) - 2) / 2
    # column 2 + 2p holds profile p's change, its name is that word less "_ppl_rel_pct"
    name(p) = (w = word(hdr, 3 + 2 * p), w[1:strstrt(w, "_ppl_rel_pct") - 1])
    set output img."/quality_layers.png"
    set multiplot layout 1,2 title what.": per-layer sensitivity, only layer l stored in the scheme, the others lossless"
    set style data histograms
    set style histogram clustered gap 1
    set boxwidth 0.9
    set key inside top right vertical
    set xlabel "layer"
    set ylabel "perplexity change vs lossless, %"
    set title "perplexity"
    plot for [p=0:np-1] f using 2 + 2 * p:xtic(1) title name(p)
    set title "distribution shift"
    set ylabel "mean KL(reference || run), nats (log)"
    set logscale y
    set format y "%g"
    plot for [p=0:np-1] f using 3 + 2 * p:xtic(1) title name(p)
    unset multiplot
    unset logscale y
}
