// A minimal DRA kubelet plugin on the upstream kubeletplugin helper, as its users
// write one: the helper registers with the kubelet, serves the DRA gRPC service,
// fetches each claim and serializes calls (its default); the plugin writes one CDI
// spec and one checkpoint file per claim (temp file, fsync unless -fsync=false,
// rename) and removes both on unprepare. The reference for tests/bench/bench_prepare.py.
// With -devices FILE (a JSON list of resource.k8s.io/v1 devices) it also publishes them
// as the node's pool through the helper's ResourceSlice controller, as upstream drivers
// do once at start: the reference for tests/bench/bench_join.py.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

type driver struct {
	name, node, cdiRoot, stateDir string
	fsync                         bool
}

func (d *driver) write(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if d.fsync {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (d *driver) specPath(uid types.UID) string {
	return filepath.Join(d.cdiRoot, fmt.Sprintf("k8s.%s-claim_%s.json", d.name, uid))
}

func (d *driver) checkpointPath(uid types.UID) string {
	return filepath.Join(d.stateDir, string(uid)+".json")
}

func (d *driver) prepare(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	var devices []kubeletplugin.Device
	var cdiDevices []map[string]any
	if claim.Status.Allocation != nil {
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver != d.name || r.Pool != d.node {
				continue
			}
			id := fmt.Sprintf("k8s.%s/claim=%s-%s", d.name, claim.UID, r.Device)
			devices = append(devices, kubeletplugin.Device{
				Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
				CDIDeviceIDs: []string{id},
			})
			cdiDevices = append(cdiDevices, map[string]any{
				"name":           fmt.Sprintf("%s-%s", claim.UID, r.Device),
				"containerEdits": map[string]any{"deviceNodes": []any{map[string]any{"path": "/dev/null"}}},
			})
		}
	}
	spec, err := json.Marshal(map[string]any{
		"cdiVersion": "0.6.0", "kind": "k8s." + d.name + "/claim", "devices": cdiDevices,
	})
	if err == nil {
		err = d.write(d.specPath(claim.UID), spec)
	}
	if err == nil {
		record, _ := json.Marshal(map[string]any{
			"namespace": claim.Namespace, "name": claim.Name, "devices": devices,
		})
		err = d.write(d.checkpointPath(claim.UID), record)
	}
	if err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	return kubeletplugin.PrepareResult{Devices: devices}
}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		out[claim.UID] = d.prepare(claim)
	}
	return out, nil
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		err := os.Remove(d.specPath(claim.UID))
		if err == nil || os.IsNotExist(err) {
			err = os.Remove(d.checkpointPath(claim.UID))
		}
		if os.IsNotExist(err) {
			err = nil
		}
		out[claim.UID] = err
	}
	return out, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", msg, err)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	d := &driver{}
	flag.StringVar(&d.name, "driver-name", "gpu.nvidia.com", "driver name")
	flag.StringVar(&d.node, "node-name", "", "node name")
	flag.StringVar(&d.cdiRoot, "cdi-root", "", "CDI spec directory")
	pluginDir := flag.String("plugin-dir", "", "plugin data directory (the DRA socket)")
	registrarDir := flag.String("registrar-dir", "", "kubelet plugin registry directory")
	flag.BoolVar(&d.fsync, "fsync", true, "fsync each file before its rename")
	devicesFile := flag.String("devices", "", "JSON list of devices to publish as the node's pool")
	flag.Parse()
	d.stateDir = filepath.Join(*pluginDir, "claims")
	for _, dir := range []string{d.cdiRoot, d.stateDir, *registrarDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			panic(err)
		}
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		panic(err)
	}
	config.QPS, config.Burst = -1, 0 // client-go's rate limit off
	config.ContentType = "application/json"
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		panic(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.KubeClient(client),
		kubeletplugin.DriverName(d.name),
		kubeletplugin.NodeName(d.node),
		kubeletplugin.PluginDataDirectoryPath(*pluginDir),
		kubeletplugin.RegistrarDirectoryPath(*registrarDir),
	)
	if err != nil {
		panic(err)
	}
	if *devicesFile != "" {
		data, err := os.ReadFile(*devicesFile)
		if err != nil {
			panic(err)
		}
		var devices []resourceapi.Device
		if err := json.Unmarshal(data, &devices); err != nil {
			panic(err)
		}
		pools := map[string]resourceslice.Pool{d.node: {Slices: []resourceslice.Slice{{Devices: devices}}}}
		if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: pools}); err != nil {
			panic(err)
		}
	}
	fmt.Println("ready")
	<-ctx.Done()
	helper.Stop()
}
