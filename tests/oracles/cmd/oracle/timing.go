package main

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
)

// schedulerParallelism is the kube-scheduler's default parallelism
// (pkg/scheduler/framework/parallelize, DefaultParallelism): how many nodes its
// Filter phase checks at once.
const schedulerParallelism = 16

// timing asks for the allocator's own time on a case: for each parallelism, Repeat runs
// of NewAllocator and then Allocate on every node of the case.
type timing struct {
	Parallelism []int `json:"parallelism"`
	Repeat      int   `json:"repeat"`
}

type timings struct {
	// Threads Go runs at once here: parallelism beyond it only interleaves.
	GOMAXPROCS int           `json:"gomaxprocs"`
	Runs       []parallelRun `json:"runs"`
}

// parallelRun holds one parallelism's samples, one per repeat, in seconds.
type parallelRun struct {
	Parallelism         int       `json:"parallelism"`
	NewAllocatorSeconds []float64 `json:"newAllocatorSeconds"`
	LoopSeconds         []float64 `json:"loopSeconds"`
	// Nodes allocated in each run: the same work was done each time.
	Allocated []int `json:"allocated"`
}

func measure(ctx context.Context, in *allocInput, nodes []*v1.Node, t timing) (*timings, error) {
	if t.Repeat < 1 || t.Repeat > 100 {
		return nil, fmt.Errorf("repeat %d: want 1 to 100", t.Repeat)
	}
	out := &timings{GOMAXPROCS: runtime.GOMAXPROCS(0)}
	raw := make([]rawOutcome, len(nodes))
	for _, p := range t.Parallelism {
		if p < 1 {
			return nil, fmt.Errorf("parallelism %d: want at least 1", p)
		}
		run := parallelRun{Parallelism: p}
		for range t.Repeat {
			// Each run starts without the previous run's garbage, so runs compare.
			runtime.GC()
			start := time.Now()
			alloc, err := in.newAllocator(ctx)
			if err != nil {
				return nil, fmt.Errorf("NewAllocator: %w", err)
			}
			made := time.Now()
			parallelize(p, len(nodes), func(i int) {
				raw[i] = allocateNode(ctx, alloc, nodes[i], in.claim)
			})
			done := time.Now()
			run.NewAllocatorSeconds = append(run.NewAllocatorSeconds, made.Sub(start).Seconds())
			run.LoopSeconds = append(run.LoopSeconds, done.Sub(made).Seconds())
			allocated := 0
			for i := range raw {
				if raw[i].err == nil && !raw[i].timedOut && len(raw[i].results) > 0 {
					allocated++
				}
			}
			run.Allocated = append(run.Allocated, allocated)
		}
		out.Runs = append(out.Runs, run)
	}
	return out, nil
}

// parallelize calls fn for 0..n-1 on p workers, in chunks, as the scheduler's
// Parallelizer does through workqueue.ParallelizeUntil.
func parallelize(p, n int, fn func(int)) {
	if n == 0 {
		return
	}
	chunk := chunkSizeFor(n, p)
	chunks := (n + chunk - 1) / chunk
	workers := min(p, chunks)
	var next atomic.Int64
	var wg sync.WaitGroup
	wg.Add(workers)
	for range workers {
		go func() {
			defer wg.Done()
			for {
				c := int(next.Add(1)) - 1
				if c >= chunks {
					return
				}
				for i := c * chunk; i < min((c+1)*chunk, n); i++ {
					fn(i)
				}
			}
		}()
	}
	wg.Wait()
}

// chunkSizeFor is the scheduler's (pkg/scheduler/framework/parallelize): the square
// root of n, at most n/parallelism+1.
func chunkSizeFor(n, parallelism int) int {
	s := int(math.Sqrt(float64(n)))
	if r := n/parallelism + 1; s > r {
		s = r
	}
	return max(s, 1)
}
