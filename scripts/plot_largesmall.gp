# Plots the large-small figures of docs/benchmarks.md ("Large–small: the paper's Table II at
# this scale"): largesmall_ttft.png from scripts/bench_largesmall.sh's largesmall_wide.dat (TTFT
# and total time per mode, both cloud links, each context length), and largesmall_quality.png
# from `kvedge lseval --dat` (perplexity and greedy agreement per mode). A missing file is
# skipped.
#
#   gnuplot -e "timing='/tmp/kvedge-bls/largesmall_wide.dat'; quality='/tmp/ls/quality.dat'; \
#               img='docs/img'" scripts/plot_largesmall.gp
#
# Needs gnuplot with the pngcairo terminal (Debian: gnuplot-nox).
if (!exists("timing")) timing = "largesmall_wide.dat"
if (!exists("quality")) quality = "quality.dat"
if (!exists("img")) img = "."

have(f) = int(system(sprintf("test -s '%s' && echo 1 || echo 0", f)))

set terminal pngcairo size 1100,560 noenhanced font "sans,10"
set grid ytics lc rgb "#dddddd"
set datafile missing "nan"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set yrange [0:*]
set key top left noopaque
set xtics rotate by -30 scale 0

# ---- TTFT and total per mode: columns 2..(1+2C) are TTFT then total for C (context, link)
if (have(timing)) {
    set output img."/largesmall_ttft.png"
    ncols = int(system(sprintf("head -1 '%s' | wc -w", timing))) - 1
    c = ncols / 2
    set multiplot layout 1,2 title \
        "KJV pair (cloud 6 x 6 x 32, edge 3 x 4 x 32); cloud link 10 ms one way, peer 1 Gbit/s 1 ms; medians"
    set ylabel "ms"
    set title "time to first token"
    set key autotitle columnheader
    plot for [i=2:1+c] timing using i:xtic(1) title columnheader(i)
    set title "total time, 32 new tokens"
    plot for [i=2+c:1+2*c] timing using i:xtic(1) title columnheader(i)
    unset multiplot
    set key noautotitle
}

# ---- Quality per mode: perplexity, and agreement with cloud-only and edge-only
if (have(quality)) {
    set output img."/largesmall_quality.png"
    set multiplot layout 1,2 title \
        "Continuations of held-out KJV text, teacher-forced (kvedge lseval): 256-token context, 64 scored"
    set title "perplexity (lower is better)"
    set ylabel "perplexity"
    set yrange [40:*]
    plot quality using 3:xtic(2) title "perplexity" lc rgb "#4477aa", \
         quality using ($0):3:(sprintf("%.1f", $3)) with labels offset 0, 0.6 font ",8" notitle
    set title "greedy next-token agreement"
    set ylabel "share of positions"
    set yrange [0.5:1.1]
    set key top right
    plot quality using 4:xtic(2) title "with cloud-only (LLM)" lc rgb "#cc6677", \
         quality using 5 title "with edge-only (SLM)" lc rgb "#117733"
    unset multiplot
}
