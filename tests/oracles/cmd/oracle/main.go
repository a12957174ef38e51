// Command oracle answers allocation and CEL cases with the upstream libraries the
// kube-scheduler and kube-apiserver use: k8s.io/dynamic-resource-allocation/structured
// (the structured-parameters allocator) and k8s.io/dynamic-resource-allocation/cel
// (the DRA CEL environment). It reads one JSON case per line on stdin and writes one
// JSON answer per line on stdout, in the same order, so one process serves a whole
// test run. tests/oracles/client.py is its Python side.
//
// An allocate case with "timing" also reports how long the allocator itself takes on it,
// after decoding: NewAllocator, then Allocate for every node as the scheduler's Filter
// calls it, at each parallelism asked (timing.go). "oracle explain" (explain.go) is the
// whole process on files, as `gpu-dra explain --slices FILE` runs on them.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/cel/environment"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// features are the allocator switches the kube-scheduler of each version sets from
// its default feature gates (pkg/scheduler/framework/plugins/dynamicresources).
var features = map[string]structured.Features{
	// 1.34: DRAAdminAccess and DRAPrioritizedList beta (on); partitionable devices,
	// device taints, binding conditions and consumable capacity alpha (off).
	"1.34": {AdminAccess: true, PrioritizedList: true},
	// 1.36: admin access and prioritized list GA; partitionable devices, device taints,
	// consumable capacity, binding conditions with claim device status beta (on).
	"1.36": {
		AdminAccess:            true,
		PrioritizedList:        true,
		PartitionableDevices:   true,
		DeviceTaints:           true,
		DeviceBindingAndStatus: true,
		ConsumableCapacity:     true,
	},
}

type node struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
}

type request struct {
	ID   int    `json:"id"`
	Kind string `json:"kind"` // "allocate" or "cel"

	// allocate
	Version   string                       `json:"version"`
	Slices    []*resourceapi.ResourceSlice `json:"slices"`
	Classes   []*resourceapi.DeviceClass   `json:"classes"`
	Claim     *resourceapi.ResourceClaim   `json:"claim"`
	Allocated []*resourceapi.ResourceClaim `json:"allocated"`
	Nodes     []node                       `json:"nodes"`
	Timing    *timing                      `json:"timing,omitempty"`

	// cel
	Expression string              `json:"expression"`
	Driver     string              `json:"driver"`
	Device     *resourceapi.Device `json:"device"`
}

type result struct {
	Request string `json:"request"`
	Driver  string `json:"driver"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	// Only for a share of a device with allowMultipleAllocations (consumable capacity).
	ConsumedCapacity map[string]string `json:"consumedCapacity,omitempty"`
}

// nodeOutcome is "allocated" (with results), "unschedulable" (nil result, or an error
// wrapping ErrFailedAllocationOnNode), "error" (Allocate failed for the whole attempt) or
// "timeout" (no answer within the time a scheduler's Filter gets).
type nodeOutcome struct {
	Outcome string   `json:"outcome"`
	Results []result `json:"results,omitempty"`
	Error   string   `json:"error,omitempty"`
}

type answer struct {
	ID    int                    `json:"id"`
	Error string                 `json:"error,omitempty"` // the case itself was unusable
	Nodes map[string]nodeOutcome `json:"nodes,omitempty"`
	// Only for a case with "timing": the allocator's own seconds on it.
	Timings *timings `json:"timings,omitempty"`

	// cel: "ok" with a value, "compile" or "runtime" with the error text.
	Outcome string `json:"outcome,omitempty"`
	Value   *bool  `json:"value,omitempty"`
	Detail  string `json:"detail,omitempty"`
	// The API server would refuse the expression as too complex (estimated cost).
	OverCost bool `json:"overCost,omitempty"`
}

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("deviceclass %q not found", name)
}

var (
	caches  = map[string]*dracel.Cache{}
	cacheMu sync.Mutex
)

const timeout = 2 * time.Second

func allocate(ctx context.Context, req *request) answer {
	feats, ok := features[req.Version]
	if !ok {
		return answer{ID: req.ID, Error: fmt.Sprintf("unknown version %q", req.Version)}
	}
	if req.Claim == nil {
		return answer{ID: req.ID, Error: "no claim"}
	}
	defaultClaim(req.Claim)
	in := allocInput{
		feats:   feats,
		cache:   celCache(req.Version, feats),
		classes: classLister{},
		state:   allocatedState(feats, req.Allocated),
		slices:  req.Slices,
		claim:   req.Claim,
	}
	for _, c := range req.Classes {
		in.classes[c.Name] = c
	}
	nodes := make([]*v1.Node, len(req.Nodes))
	for i, n := range req.Nodes {
		nodes[i] = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels}}
	}
	alloc, err := in.newAllocator(ctx)
	if err != nil {
		return answer{ID: req.ID, Error: "NewAllocator: " + err.Error()}
	}
	out := answer{ID: req.ID, Nodes: map[string]nodeOutcome{}}
	for _, n := range nodes {
		out.Nodes[n.Name] = outcome(allocateNode(ctx, alloc, n, req.Claim))
	}
	if req.Timing != nil {
		t, err := measure(ctx, &in, nodes, *req.Timing)
		if err != nil {
			return answer{ID: req.ID, Error: "timing: " + err.Error()}
		}
		out.Timings = t
	}
	return out
}

// allocInput is what NewAllocator is made from: the decoded case.
type allocInput struct {
	feats   structured.Features
	cache   *dracel.Cache
	classes classLister
	state   structured.AllocatedState
	slices  []*resourceapi.ResourceSlice
	claim   *resourceapi.ResourceClaim
}

func (in *allocInput) newAllocator(ctx context.Context) (structured.Allocator, error) {
	return structured.NewAllocator(ctx, in.feats, in.state, in.classes, in.slices, in.cache)
}

// celCache is one compiled-expression cache per version for the process, as the
// scheduler keeps one for its lifetime.
func celCache(version string, feats structured.Features) *dracel.Cache {
	cacheMu.Lock()
	defer cacheMu.Unlock()
	cache := caches[version]
	if cache == nil {
		cache = dracel.NewCache(1000, dracel.Features{EnableConsumableCapacity: feats.ConsumableCapacity})
		caches[version] = cache
	}
	return cache
}

func allocatedState(feats structured.Features, allocated []*resourceapi.ResourceClaim) structured.AllocatedState {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, c := range allocated {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			// As the scheduler's allocated-device tracker: admin access takes nothing.
			if r.AdminAccess != nil && *r.AdminAccess {
				continue
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			// A share takes part of the device, as the tracker's foreachAllocatedDevice.
			if feats.ConsumableCapacity && r.ShareID != nil {
				state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
				if r.ConsumedCapacity != nil {
					state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
				}
				continue
			}
			state.AllocatedDevices.Insert(id)
		}
	}
	return state
}

// rawOutcome is what one Allocate call gave, before it is turned into an answer.
type rawOutcome struct {
	results  []resourceapi.AllocationResult
	err      error
	timedOut bool
}

func allocateNode(ctx context.Context, alloc structured.Allocator, node *v1.Node, claim *resourceapi.ResourceClaim) rawOutcome {
	// The scheduler bounds a Filter call the same way (DRASchedulerFilterTimeout);
	// without it one combinatorial case could stall the whole stream.
	nodeCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	results, err := alloc.Allocate(nodeCtx, node, []*resourceapi.ResourceClaim{claim})
	return rawOutcome{results: results, err: err, timedOut: nodeCtx.Err() != nil}
}

func outcome(raw rawOutcome) nodeOutcome {
	switch {
	case raw.timedOut:
		return nodeOutcome{Outcome: "timeout"}
	case raw.err != nil && errors.Is(raw.err, structured.ErrFailedAllocationOnNode):
		return nodeOutcome{Outcome: "unschedulable", Error: raw.err.Error()}
	case raw.err != nil:
		return nodeOutcome{Outcome: "error", Error: raw.err.Error()}
	case len(raw.results) == 0:
		return nodeOutcome{Outcome: "unschedulable"}
	}
	o := nodeOutcome{Outcome: "allocated", Results: []result{}}
	for _, r := range raw.results[0].Devices.Results {
		res := result{Request: r.Request, Driver: r.Driver, Pool: r.Pool, Device: r.Device}
		if r.ShareID != nil {
			res.ConsumedCapacity = map[string]string{}
			for name, q := range r.ConsumedCapacity {
				res.ConsumedCapacity[string(name)] = q.String()
			}
		}
		o.Results = append(o.Results, res)
	}
	return o
}

// defaultClaim applies the API server's defaults (pkg/apis/resource/v1/defaults.go),
// which the allocator relies on: the cases are written as a client would send them.
func defaultClaim(claim *resourceapi.ResourceClaim) {
	exact := func(mode *resourceapi.DeviceAllocationMode, count *int64, tolerations []resourceapi.DeviceToleration) {
		if *mode == "" {
			*mode = resourceapi.DeviceAllocationModeExactCount
		}
		if *mode == resourceapi.DeviceAllocationModeExactCount && *count == 0 {
			*count = 1
		}
		for i := range tolerations {
			if tolerations[i].Operator == "" {
				tolerations[i].Operator = resourceapi.DeviceTolerationOpEqual
			}
		}
	}
	for i := range claim.Spec.Devices.Requests {
		r := &claim.Spec.Devices.Requests[i]
		if r.Exactly != nil {
			exact(&r.Exactly.AllocationMode, &r.Exactly.Count, r.Exactly.Tolerations)
		}
		for j := range r.FirstAvailable {
			s := &r.FirstAvailable[j]
			exact(&s.AllocationMode, &s.Count, s.Tolerations)
		}
	}
}

func evalCEL(ctx context.Context, req *request) answer {
	out := answer{ID: req.ID}
	// What the API server accepts in a new object (pkg/apis/resource/validation).
	envType := environment.NewExpressions
	compiled := dracel.GetCompiler(dracel.Features{EnableConsumableCapacity: true}).
		CompileCELExpression(req.Expression, dracel.Options{EnvType: &envType})
	if compiled.Error != nil {
		out.Outcome, out.Detail = "compile", compiled.Error.Error()
		return out
	}
	// validateCELSelector refuses a compiling expression whose estimated worst case is too
	// costly; it is still evaluated here, so its value can be compared too.
	out.OverCost = compiled.MaxCost > resourceapi.CELSelectorExpressionMaxCost
	dev := dracel.Device{Driver: req.Driver}
	if req.Device != nil {
		dev.Attributes = req.Device.Attributes
		dev.Capacity = req.Device.Capacity
		dev.AllowMultipleAllocations = req.Device.AllowMultipleAllocations
	}
	value, _, err := compiled.DeviceMatches(ctx, dev)
	if err != nil {
		out.Outcome, out.Detail = "runtime", err.Error()
		return out
	}
	out.Outcome, out.Value = "ok", &value
	return out
}

func main() {
	ctx := context.Background()
	if len(os.Args) > 1 && os.Args[1] == "explain" {
		os.Exit(explainMain(ctx, os.Args[2:]))
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 0, 1<<20), 256<<20)
	w := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(w)
	for in.Scan() {
		var req request
		var ans answer
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			ans = answer{ID: req.ID, Error: "decode: " + err.Error()}
		} else if req.Kind == "cel" {
			ans = evalCEL(ctx, &req)
		} else {
			ans = allocate(ctx, &req)
		}
		if err := enc.Encode(ans); err != nil {
			fmt.Fprintln(os.Stderr, "encode:", err)
			os.Exit(1)
		}
		if err := w.Flush(); err != nil {
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "read:", err)
		os.Exit(1)
	}
}
