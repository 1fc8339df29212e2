// etcdload: the etcd side of bench/scenarios/commits_etcd.sh. Puts TOTAL
// values into etcd from CLIENTS concurrent clients (each waits for its put's
// reply before sending the next) over CONNS gRPC connections with etcd's
// native Go client (clientv3), as etcd's own `benchmark put` tool does, and
// prints one JSON object: puts, seconds, puts_per_s, p50_us, p99_us,
// p999_us, max_us, errors. Exit status 1 if any put failed.
//
// Built from Debian's golang-go and golang-etcd-server-dev without modules:
//   GO111MODULE=off GOPATH=/usr/share/gocode go build -o etcdload bench/etcdload/main.go
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/clientv3"
)

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "comma-separated client endpoints")
	total := flag.Int64("total", 1000, "number of puts (all clients together)")
	clients := flag.Int("clients", 1, "concurrent clients")
	conns := flag.Int("conns", 1, "gRPC connections the clients share (client k uses connection k % conns)")
	valSize := flag.Int("val-size", 100, "bytes per value")
	keySpace := flag.Int64("key-space", 1000, "distinct keys (put i writes key i % key-space)")
	timeout := flag.Duration("timeout", 10*time.Second, "per-put timeout")
	flag.Parse()
	if *clients < 1 || *conns < 1 || *conns > *clients || *total < 1 || *keySpace < 1 {
		fmt.Fprintln(os.Stderr, "etcdload: need total >= 1, key-space >= 1 and 1 <= conns <= clients")
		os.Exit(2)
	}
	eps := strings.Split(*endpoints, ",")
	cs := make([]*clientv3.Client, *conns)
	for i := range cs {
		c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
		if err != nil {
			fmt.Fprintf(os.Stderr, "etcdload: connect %s: %v\n", *endpoints, err)
			os.Exit(1)
		}
		defer c.Close()
		cs[i] = c
	}
	value := strings.Repeat("v", *valSize)
	var next, errors int64
	var firstErr atomic.Value
	lat := make([][]float64, *clients)
	var wg sync.WaitGroup
	start := time.Now()
	for k := 0; k < *clients; k++ {
		wg.Add(1)
		go func(k int) {
			defer wg.Done()
			c := cs[k%*conns]
			for {
				i := atomic.AddInt64(&next, 1) - 1
				if i >= *total {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), *timeout)
				t0 := time.Now()
				_, err := c.Put(ctx, fmt.Sprintf("bench-key-%d", i%*keySpace), value)
				cancel()
				if err != nil {
					atomic.AddInt64(&errors, 1)
					firstErr.Store(err.Error())
					continue
				}
				lat[k] = append(lat[k], float64(time.Since(t0).Nanoseconds())/1000.0)
			}
		}(k)
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	var all []float64
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Float64s(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		i := int(p * float64(len(all)))
		if i >= len(all) {
			i = len(all) - 1
		}
		return all[i]
	}
	out := map[string]interface{}{
		"puts": len(all), "seconds": secs, "puts_per_s": float64(len(all)) / secs,
		"p50_us": pct(0.50), "p99_us": pct(0.99), "p999_us": pct(0.999), "max_us": pct(1.0),
		"clients": *clients, "conns": *conns, "errors": errors,
	}
	if e, ok := firstErr.Load().(string); ok {
		out["first_error"] = e
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	if errors > 0 {
		os.Exit(1)
	}
}
