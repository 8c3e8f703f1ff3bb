# Loss curves of the trained models (models/kjv/*/loss.csv, written by scripts/train_models.py):
#   gnuplot scripts/plot_loss.gp      -> docs/img/kjv_loss.png
set terminal pngcairo size 900,480 font ",10"
set output "docs/img/kjv_loss.png"
set datafile separator ","
set key top right
set grid
set xlabel "training tokens (millions)"
set ylabel "cross-entropy, nats per token"
set title "models/kjv: training loss (EMA) and held-out loss, seed 20261124"
plot "models/kjv/cloud/loss.csv" every ::1 using ($2/1e6):3 with lines lw 2 lc rgb "#1f77b4" title "cloud 6x192, train", \
     "" every ::1 using ($2/1e6):4 with linespoints pt 7 ps 0.5 lc rgb "#1f77b4" dt 2 title "cloud, held-out", \
     "models/kjv/edge/loss.csv" every ::1 using ($2/1e6):3 with lines lw 2 lc rgb "#d62728" title "edge 3x128, train", \
     "" every ::1 using ($2/1e6):4 with linespoints pt 7 ps 0.5 lc rgb "#d62728" dt 2 title "edge, held-out"
