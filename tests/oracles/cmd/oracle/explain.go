package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// explainMain is the oracle as a whole process on files, the counterpart of
// `gpu-dra explain -o json --slices FILE -f CLAIM --deviceclass FILE`: read and decode
// the files, allocate the claim on every node the slices name (no Node labels, as
// explain without --cluster), write every node's outcome as one JSON document. Exit
// status as explain's: 0 allocatable somewhere, 1 nowhere, 2 bad input.
func explainMain(ctx context.Context, args []string) int {
	flags := flag.NewFlagSet("explain", flag.ContinueOnError)
	var slicesFiles, allocatedFiles, classFiles listFlag
	flags.Var(&slicesFiles, "slices", "file with ResourceSlices, JSON: one object or a List (repeatable)")
	flags.Var(&classFiles, "deviceclass", "file with DeviceClasses (repeatable)")
	flags.Var(&allocatedFiles, "allocated", "file with allocated ResourceClaims (repeatable)")
	claimFile := flags.String("f", "", "file with the ResourceClaim")
	version := flags.String("version", "1.36", "the scheduler version whose feature defaults apply")
	parallelism := flags.Int("parallelism", schedulerParallelism, "nodes allocated at once")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "oracle explain:", err)
		return 2
	}
	feats, ok := features[*version]
	if !ok || *claimFile == "" || len(slicesFiles) == 0 || *parallelism < 1 {
		return fail(fmt.Errorf("need -f CLAIM, --slices FILE, a known --version and --parallelism >= 1"))
	}
	var in allocInput
	in.feats, in.cache, in.classes = feats, celCache(*version, feats), classLister{}
	for _, path := range slicesFiles {
		if err := readObjects(path, &in.slices); err != nil {
			return fail(err)
		}
	}
	var allocated, claims []*resourceapi.ResourceClaim
	var classList []*resourceapi.DeviceClass
	for _, path := range classFiles {
		if err := readObjects(path, &classList); err != nil {
			return fail(err)
		}
	}
	for _, c := range classList {
		in.classes[c.Name] = c
	}
	for _, path := range allocatedFiles {
		if err := readObjects(path, &allocated); err != nil {
			return fail(err)
		}
	}
	if err := readObjects(*claimFile, &claims); err != nil {
		return fail(err)
	}
	if len(claims) != 1 {
		return fail(fmt.Errorf("%s: want one ResourceClaim, found %d", *claimFile, len(claims)))
	}
	in.claim = claims[0]
	defaultClaim(in.claim)
	in.state = allocatedState(feats, allocated)

	names := map[string]bool{}
	for _, s := range in.slices {
		if s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
			names[*s.Spec.NodeName] = true
		}
	}
	nodes := make([]*v1.Node, 0, len(names))
	for name := range names {
		nodes = append(nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })

	alloc, err := in.newAllocator(ctx)
	if err != nil {
		return fail(fmt.Errorf("NewAllocator: %w", err))
	}
	raw := make([]rawOutcome, len(nodes))
	parallelize(*parallelism, len(nodes), func(i int) {
		raw[i] = allocateNode(ctx, alloc, nodes[i], in.claim)
	})
	doc := struct {
		Nodes       map[string]nodeOutcome `json:"nodes"`
		Allocatable int                    `json:"allocatable"`
	}{Nodes: make(map[string]nodeOutcome, len(nodes))}
	for i, n := range nodes {
		o := outcome(raw[i])
		if o.Outcome == "allocated" {
			doc.Allocatable++
		}
		doc.Nodes[n.Name] = o
	}
	w := bufio.NewWriter(os.Stdout)
	if err := json.NewEncoder(w).Encode(doc); err != nil || w.Flush() != nil {
		return 2
	}
	if doc.Allocatable == 0 {
		return 1
	}
	return 0
}

type listFlag []string

func (l *listFlag) String() string     { return fmt.Sprint(*l) }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// readObjects appends the objects of a JSON file, one object or a v1 List, to out.
func readObjects[T any](path string, out *[]*T) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var list struct {
		Kind  string `json:"kind"`
		Items []*T   `json:"items"`
	}
	if err := json.Unmarshal(data, &list); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if list.Kind == "List" || list.Kind == "" && list.Items != nil {
		*out = append(*out, list.Items...)
		return nil
	}
	one := new(T)
	if err := json.Unmarshal(data, one); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	*out = append(*out, one)
	return nil
}
