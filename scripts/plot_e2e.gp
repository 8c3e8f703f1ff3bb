# Plots the data files of bench/bench_e2e (e2e_table2.dat, e2e_poisson.dat, e2e_sweep.dat)
# as e2e_table2.png, e2e_poisson.png and e2e_sweep.png. A missing data file is skipped.
#
#   gnuplot -e "data='build/bench/e2e'; img='docs/img'" scripts/plot_e2e.gp
#
# Needs gnuplot with the pngcairo terminal (Debian: gnuplot-nox).
if (!exists("data")) data = "."
if (!exists("img")) img = "."

have(f) = int(system(sprintf("test -s '%s' && echo 1 || echo 0", f)))

set terminal pngcairo size 1000,560 enhanced font "sans,10"
set grid ytics lc rgb "#dddddd"
set key top left noopaque
set datafile missing "nan"

# ---- A: TTFT and total time per mode, clustered by context (CE-LSLM Table II)
f = data."/e2e_table2.dat"
if (have(f)) {
    set output img."/e2e_table2.png"
    t = "One request at a time: opt-125m shape, int8 context, cloud link 1 Gbit/s, 10 ms"
    set multiplot layout 1,2 title t
    set style data histograms
    set style histogram clustered gap 1
    set style fill solid 0.85 border -1
    set boxwidth 0.9
    set xlabel "context tokens"
    set ylabel "TTFT ms (median)"
    set yrange [0:*]
    set offsets 0, 0, graph 0.12, 0
    set key autotitle columnheader # the header line is not data for the label plots either
    # bar k (0..3) of cluster j sits at j + (k - 1.5) / (4 bars + gap 1)
    set title "time to first token"
    plot for [i=2:5] f using i:xtic(1) title columnheader(i), \
         for [i=2:5] f using ($0 + (i - 3.5) / 5.0):i:(sprintf("%.0f", column(i))) \
             with labels offset 0, 0.6 font ",8" notitle
    set ylabel "total ms (median)"
    set title "arrival to last token"
    plot for [i=6:9] f using i:xtic(1) title columnheader(i), \
         for [i=6:9] f using ($0 + (i - 7.5) / 5.0):i:(sprintf("%.0f", column(i))) \
             with labels offset 0, 0.6 font ",8" notitle
    unset multiplot
    set offsets 0, 0, 0, 0
    set key noautotitle
    unset style data
    set style data points
    unset boxwidth
    set yrange [*:*]
}

# ---- B: latency, TTFT and throughput against the request rate (CE-LSLM Fig. 7)
f = data."/e2e_poisson.dat"
if (have(f)) {
    stats f using 1 nooutput
    nb = STATS_blocks
    set output img."/e2e_poisson.png"
    set terminal pngcairo size 1400,480 enhanced font "sans,10"
    t = "Poisson arrivals: kvedge (edge workers) vs cloud-only (one cloud model); " . \
        "all processes on the same cores"
    set multiplot layout 1,3 title t
    set xlabel "arrival rate, requests/s"
    set logscale x 2
    set logscale y
    set ylabel "latency p50 ms (arrival to last token)"
    set title "latency p50 (bars: p95)"
    # blocks alternate kvedge, cloud-only per context: colour by system, dash by context
    sys_lc(i) = i % 2 ? "#1b9e77" : "#7570b3"
    ctx_dt(i) = int(i / 2) + 1
    ctx_pt(i) = int(i / 2) + 6
    plot for [i=0:nb-1] f index i using 1:3:3:4 with yerrorlines lw 1.5 \
         lc rgb sys_lc(i) dt ctx_dt(i) pt ctx_pt(i) title columnheader(2)
    set ylabel "TTFT p50 ms (arrival to first token)"
    set title "time to first token p50"
    plot for [i=0:nb-1] f index i using 1:5 with linespoints lw 1.5 \
         lc rgb sys_lc(i) dt ctx_dt(i) pt ctx_pt(i) title columnheader(2)
    unset logscale y
    set yrange [0:*]
    set ylabel "completed requests/s"
    set title "throughput"
    plot for [i=0:nb-1] f index i using 1:7 with linespoints lw 1.5 \
         lc rgb sys_lc(i) dt ctx_dt(i) pt ctx_pt(i) title columnheader(2), \
         x with lines dt 2 lc rgb "#888888" title "offered load"
    unset multiplot
    unset logscale
    set yrange [*:*]
    set terminal pngcairo size 1000,560 enhanced font "sans,10"
}

# ---- C: TTFT against the cloud link's rate, with the Eq. 20 bound and both single sources
f = data."/e2e_sweep.dat"
if (have(f)) {
    set output img."/e2e_sweep.png"
    set title "TTFT vs cloud link (10 ms one way), opt-125m shape, int8 context"
    set xlabel "cloud link, bits/s"
    set ylabel "TTFT ms (median)"
    set logscale xy
    set format x "10^{%L}"
    set key top right
    plot f using 1:3 with linespoints lw 2 pt 7 title "kvedge", \
         f using 1:4 with linespoints dt 2 pt 6 title "Eq. 20 bound (kvedge's plan)", \
         f using 1:5 with linespoints pt 5 title "edge-only (recompute all)", \
         f using 1:6 with linespoints pt 9 title "fetch-all (recompute not priced)", \
         f using 1:7 with linespoints dt 3 pt 4 lc rgb "#444444" title "transfer alone (no decoder)"
    unset logscale
    set format x
}
unset output
