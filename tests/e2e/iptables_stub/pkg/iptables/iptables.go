// Package iptables stands in for sigs.k8s.io/iptables-wrappers/pkg/iptables, which the Go
// module proxy does not serve (403), so that the e2e tier can build Kubernetes 1.38's kubelet.
//
// It has only what the kubelet names (pkg/kubelet/kubelet_network_linux.go), and it finds
// no iptables: NewBestEffort returns no client, so the kubelet logs that it makes no
// KUBE-IPTABLES-HINT or KUBE-FIREWALL chain and goes on, as it does on an nftables-only
// host. kube-proxy needs the whole library and is not built against it.
package iptables

import (
	"context"
	"time"
)

// Chain is an iptables chain name.
type Chain string

// Table is an iptables table name.
type Table string

// RulePosition says where EnsureRule puts a rule.
type RulePosition string

// Protocol is the IP family a client works on.
type Protocol string

// Mode says which iptables binary a client runs.
type Mode string

const (
	ChainInput       Chain        = "INPUT"
	ChainOutput      Chain        = "OUTPUT"
	TableFilter      Table        = "filter"
	TableMangle      Table        = "mangle"
	TableNAT         Table        = "nat"
	Prepend          RulePosition = "-I"
	Append           RulePosition = "-A"
	UseInstalledMode Mode         = "installed"
)

// Interface is the part of the library's client the kubelet calls.
type Interface interface {
	EnsureChain(ctx context.Context, table Table, chain Chain) (bool, error)
	EnsureRule(ctx context.Context, position RulePosition, table Table, chain Chain, args ...string) (bool, error)
	IsIPv6() bool
	Protocol() Protocol
	Monitor(ctx context.Context, canary Chain, tables []Table, reload func(), interval time.Duration)
}

// NewBestEffort returns a client per IP family that iptables supports here: none.
func NewBestEffort(_ context.Context, _ Mode) map[string]Interface {
	return nil
}
