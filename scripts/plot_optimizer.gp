# Plots the data files of bench/bench_optimizer (optimizer_ttft.dat, optimizer_quality.dat,
# optimizer_ppl.dat) as optimizer_ttft.png (TTFT against the cloud link, one line per row) and
# optimizer_quality.png (mean KL and perplexity change against the cloud link, with the budgets).
#
#   gnuplot -e "data='DIR'; img='docs/img'; lat='1 ms'" scripts/plot_optimizer.gp
#
# Needs gnuplot with the pngcairo terminal (Debian: gnuplot-nox).
if (!exists("data")) data = "."
if (!exists("img")) img = "."
if (!exists("lat")) lat = "10 ms"   # the link's one-way latency, for the axis label

have(f) = int(system(sprintf("test -s '%s' && echo 1 || echo 0", f)))
# Line 2 of a data file: "# rows R budgets B"; row k is column 2 + k, budget b column 2 + R + b.
rows(f) = int(system(sprintf("sed -n '2p' '%s' | awk '{print $3}'", f)))
budgets(f) = int(system(sprintf("sed -n '2p' '%s' | awk '{print $5}'", f)))
# Adaptive rows (their names start with "adaptive") are drawn thick and dashed.
adaptive(f, k) = int(system(sprintf("sed -n '3p' '%s' | awk -F'\"' '{print ($%d ~ /^adaptive/)}'", \
                                    f, 2 * k)))

# Line style k of row k: adaptive rows thick and dashed with filled circles, fixed rows solid.
colors = "#4477aa #66ccee #228833 #ccbb44 #aa3377 #ee6677 #bb5566 #000000 #777777"
set terminal pngcairo size 1000,560 noenhanced font "sans,10"
set grid xtics ytics lc rgb "#dddddd"
set datafile missing "nan"
set logscale x 10
set format x "%.0s %cbit/s"
set xlabel sprintf("cloud link (one way; %s latency)", lat)
set key outside right top
set xrange [5e6:2e10]

f = data."/optimizer_ttft.dat"
if (have(f)) {
    R = rows(f)
    do for [k=1:R] {
        if (adaptive(f, k)) {
            set style line k lw 3 dt 2 pt 7 ps 1.2 lc rgb word(colors, k)
        } else {
            set style line k lw 1.5 dt 1 pt k ps 1 lc rgb word(colors, k)
        }
    }
    set output img."/optimizer_ttft.png"
    set title "Cache optimizer: TTFT of each fixed precision and of the adaptive choice (kjv-cloud, " . \
              "context 384, prompt 32; medians)"
    set ylabel "TTFT ms (log)"
    set logscale y 10
    plot for [k=1:R] f using 1:(column(2 + k)) with linespoints ls k \
         title columnheader(2 + k)
    unset logscale y
}

f = data."/optimizer_quality.dat"
g = data."/optimizer_ppl.dat"
if (have(f)) {
    R = rows(f)
    B = budgets(f)
    set output img."/optimizer_quality.png"
    set terminal pngcairo size 1400,560 noenhanced font "sans,10"
    set multiplot layout 1,2 title "Cache optimizer: quality against recomputation, per cloud link " . \
                                   "(each rate plans its own layers; 0 = every layer recomputed, not drawn)"
    set title "mean KL(reference || row), nats (dashed grey: the budgets)"
    set logscale y 10
    set format y "%.0e"
    set ylabel "mean KL, nats (log)"
    set key outside bottom center horizontal maxrows 3
    plot for [k=1:R] f using 1:(column(2 + k) > 0 ? column(2 + k) : 1/0) with linespoints ls k \
         title columnheader(2 + k), \
         for [b=1:B] f using 1:(column(2 + R + b)) with lines dt 3 lw 2 lc rgb "#888888" \
         title columnheader(2 + R + b)
    unset logscale y
    set format y "%g"
    if (have(g)) {
        set title "perplexity change against recomputation, %"
        set ylabel "perplexity change, %"
        plot for [k=1:R] g using 1:(column(2 + k)) with linespoints ls k \
             title columnheader(2 + k)
    }
    unset multiplot
}
