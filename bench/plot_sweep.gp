# gnuplot script for bench/sweep.sh. Variables (set with -e):
#   data  = TSV file: size peak_gbps avg_gbps mmsg_per_s p50_us p99_us
#   out   = PNG to write
#   title = plot title
set terminal pngcairo size 1200,900 font "DejaVu Sans,11"
set output out
set multiplot layout 3,1 title title
set logscale x 2
set xtics ("2" 2, "8" 8, "32" 32, "128" 128, "512" 512, "2Ki" 2048, "8Ki" 8192, "32Ki" 32768, \
           "128Ki" 131072, "512Ki" 524288, "2Mi" 2097152, "8Mi" 8388608)
set grid
set key left top
set xlabel "message size (bytes, log2)"

set ylabel "Gbit/s (1 Gbit = 1e9 bits)"
set title "Bandwidth"
set logscale y 10
plot data using 1:2 with linespoints lw 2 pt 7 title "peak (best round)", \
     data using 1:3 with linespoints lw 2 pt 5 title "average"

set ylabel "Mmsg/s"
set title "Message rate"
set key right top
plot data using 1:4 with linespoints lw 2 pt 7 title "messages per second (10^6)"

set ylabel "round trip (us)"
set title "Ping-pong latency"
set key left top
plot data using 1:5 with linespoints lw 2 pt 7 title "p50", \
     data using 1:6 with linespoints lw 2 pt 5 title "p99"
unset multiplot
