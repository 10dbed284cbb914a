package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ACL is one access control entry, as Kafka has them: the principal (User:
// name, or User:* for everyone) connecting from host (an IP address, or *)
// is allowed or denied an operation on the resources of one type whose
// name is Name (Literal; * is every one) or starts with it (Prefixed).
type ACL struct {
	ResourceType kmsg.ACLResourceType
	Name         string
	Pattern      kmsg.ACLResourcePatternType
	Principal    string
	Host         string
	Operation    kmsg.ACLOperation
	Permission   kmsg.ACLPermissionType
}

func (a ACL) String() string {
	return fmt.Sprintf("%s %s on %s %s %q from %s", a.Permission, a.Operation, a.Pattern, a.ResourceType, a.Name, a.Host) + " for " + a.Principal
}

// aclJSON is an ACL in the ACL file, with Kafka's names for the enums.
type aclJSON struct {
	ResourceType string `json:"resource_type"`
	Name         string `json:"name"`
	Pattern      string `json:"pattern"`
	Principal    string `json:"principal"`
	Host         string `json:"host"`
	Operation    string `json:"operation"`
	Permission   string `json:"permission"`
}

// valid reports an ACL that can be stored: a concrete resource type,
// pattern, operation and permission, a User: principal and a host.
func (a ACL) valid() error {
	switch a.ResourceType {
	case kmsg.ACLResourceTypeTopic, kmsg.ACLResourceTypeGroup, kmsg.ACLResourceTypeCluster, kmsg.ACLResourceTypeTransactionalId:
	default:
		return fmt.Errorf("resource type %s is not supported", a.ResourceType)
	}
	if a.Pattern != kmsg.ACLResourcePatternTypeLiteral && a.Pattern != kmsg.ACLResourcePatternTypePrefixed {
		return fmt.Errorf("pattern type %s: want literal or prefixed", a.Pattern)
	}
	if a.Name == "" {
		return errors.New("empty resource name")
	}
	if a.ResourceType == kmsg.ACLResourceTypeCluster && a.Name != "kafka-cluster" {
		return errors.New(`the cluster resource is named "kafka-cluster"`)
	}
	if !strings.HasPrefix(a.Principal, "User:") || len(a.Principal) == len("User:") {
		return fmt.Errorf("principal %q: want User:<name> or User:*", a.Principal)
	}
	if a.Host == "" {
		return errors.New("empty host (use * for any)")
	}
	if a.Operation <= kmsg.ACLOperationAny || a.Operation > kmsg.ACLOperationIdempotentWrite {
		return fmt.Errorf("operation %s is not supported", a.Operation)
	}
	if a.Permission != kmsg.ACLPermissionTypeAllow && a.Permission != kmsg.ACLPermissionTypeDeny {
		return fmt.Errorf("permission %s: want allow or deny", a.Permission)
	}
	return nil
}

// AuthorizerConfig configures an Authorizer.
type AuthorizerConfig struct {
	// File keeps the ACLs (JSON); CreateAcls and DeleteAcls rewrite it.
	// Without a file the ACLs are Initial only and cannot be changed over
	// the wire (CreateAcls and DeleteAcls answer SECURITY_DISABLED).
	File string
	// Initial ACLs, used when File does not exist yet.
	Initial []ACL
	// SuperUsers (principals, User:name) may do everything.
	SuperUsers []string
	// DenyByDefault refuses an operation on a resource no ACL names; by
	// default it is allowed (Kafka's allow.everyone.if.no.acl.found),
	// except for the two below.
	DenyByDefault bool
	// ReadOnlyTopics are the topics the relay publishes: writing to one,
	// or altering its configs, needs an ACL that allows the principal to,
	// whatever the default. Nil makes every topic read-only.
	ReadOnlyTopics func(topic string) bool
}

// Authorizer decides what each principal may do, from ACLs. Whatever the
// ACLs: super users may do everything; Produce to a read-only topic, and
// altering its configs, need an explicit allow; and describing or changing the ACLs themselves
// (Describe and Alter on the cluster) needs an explicit allow, so that the
// allow-by-default never hands out the right to change the rules.
type Authorizer struct {
	cfg   AuthorizerConfig
	super map[string]bool

	mu   sync.RWMutex
	acls []ACL
}

// NewAuthorizer loads cfg.File when it exists, cfg.Initial otherwise.
func NewAuthorizer(cfg AuthorizerConfig) (*Authorizer, error) {
	a := &Authorizer{cfg: cfg, super: map[string]bool{}, acls: slices.Clone(cfg.Initial)}
	for _, p := range cfg.SuperUsers {
		if !strings.HasPrefix(p, "User:") {
			return nil, fmt.Errorf("protocol: super user %q: want User:<name>", p)
		}
		a.super[p] = true
	}
	for _, acl := range a.acls {
		if err := acl.valid(); err != nil {
			return nil, fmt.Errorf("protocol: ACL %s: %w", acl, err)
		}
	}
	if cfg.File != "" {
		acls, err := readACLs(cfg.File)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return nil, err
		default:
			a.acls = acls
		}
	}
	return a, nil
}

// ACLs returns a copy of the current ACLs.
func (a *Authorizer) ACLs() []ACL {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return slices.Clone(a.acls)
}

func readACLs(path string) ([]ACL, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("protocol: ACL file: %w", err)
	}
	var raw []aclJSON
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("protocol: ACL file %s: %w", path, err)
	}
	acls := make([]ACL, 0, len(raw))
	for i, r := range raw {
		var acl ACL
		var errs [4]error
		acl.ResourceType, errs[0] = kmsg.ParseACLResourceType(r.ResourceType)
		acl.Pattern, errs[1] = kmsg.ParseACLResourcePatternType(r.Pattern)
		acl.Operation, errs[2] = kmsg.ParseACLOperation(r.Operation)
		acl.Permission, errs[3] = kmsg.ParseACLPermissionType(r.Permission)
		acl.Name, acl.Principal, acl.Host = r.Name, r.Principal, r.Host
		err := errors.Join(errs[:]...)
		if err == nil {
			err = acl.valid()
		}
		if err != nil {
			return nil, fmt.Errorf("protocol: ACL file %s entry %d: %w", path, i, err)
		}
		acls = append(acls, acl)
	}
	return acls, nil
}

func writeACLs(path string, acls []ACL) error {
	raw := make([]aclJSON, 0, len(acls))
	for _, a := range acls {
		raw = append(raw, aclJSON{ResourceType: lower(a.ResourceType), Name: a.Name, Pattern: lower(a.Pattern), Principal: a.Principal,
			Host: a.Host, Operation: lower(a.Operation), Permission: lower(a.Permission)})
	}
	data, err := json.MarshalIndent(raw, "", "  ")
	if err != nil {
		return err
	}
	if err := broker.WriteFileAtomic(broker.OSFS{}, path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("protocol: writing the ACL file: %w", err)
	}
	return nil
}

func lower(v fmt.Stringer) string { return strings.ToLower(v.String()) }

// clusterName is the one cluster resource's name, as in Kafka.
const clusterName = "kafka-cluster"

// Allowed reports whether principal, from host, may do op on the resource.
func (a *Authorizer) Allowed(principal, host string, op kmsg.ACLOperation, rt kmsg.ACLResourceType, name string) bool {
	if a.super[principal] {
		return true
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	named, allowed := false, false
	for _, acl := range a.acls {
		if acl.ResourceType != rt || !acl.matchesName(name) {
			continue
		}
		named = true
		if acl.Principal != principal && acl.Principal != "User:*" || acl.Host != host && acl.Host != "*" {
			continue
		}
		switch {
		case acl.Permission == kmsg.ACLPermissionTypeDeny && (acl.Operation == op || acl.Operation == kmsg.ACLOperationAll):
			return false
		case acl.Permission == kmsg.ACLPermissionTypeAllow && implies(acl.Operation, op):
			allowed = true
		}
	}
	switch {
	case allowed:
		return true
	case rt == kmsg.ACLResourceTypeCluster && (op == kmsg.ACLOperationAlter || op == kmsg.ACLOperationDescribe):
		return false
	case rt == kmsg.ACLResourceTypeTopic && (op == kmsg.ACLOperationWrite || op == kmsg.ACLOperationAlterConfigs ||
		op == kmsg.ACLOperationAlter || op == kmsg.ACLOperationDelete) && a.readOnly(name):
		// A client neither writes to the relay's topics nor changes their
		// retention, cleanup or partitions, nor deletes them or their
		// records, unless an ACL says it may.
		return false
	}
	return !named && !a.cfg.DenyByDefault
}

func (a *Authorizer) readOnly(topic string) bool {
	return a.cfg.ReadOnlyTopics == nil || a.cfg.ReadOnlyTopics(topic)
}

func (acl ACL) matchesName(name string) bool {
	if acl.Pattern == kmsg.ACLResourcePatternTypePrefixed {
		return strings.HasPrefix(name, acl.Name)
	}
	return acl.Name == name || acl.Name == "*"
}

// implies reports whether allowing granted allows op, as Kafka has it: All
// allows everything, and Read, Write, Delete and Alter each allow Describe.
func implies(granted, op kmsg.ACLOperation) bool {
	switch {
	case granted == op || granted == kmsg.ACLOperationAll:
		return true
	case op == kmsg.ACLOperationDescribe:
		return granted == kmsg.ACLOperationRead || granted == kmsg.ACLOperationWrite ||
			granted == kmsg.ACLOperationDelete || granted == kmsg.ACLOperationAlter
	}
	return false
}

// aclFilter matches ACLs for DescribeAcls and DeleteAcls.
type aclFilter struct {
	rt         kmsg.ACLResourceType
	name       *string
	pattern    kmsg.ACLResourcePatternType
	principal  *string
	host       *string
	op         kmsg.ACLOperation
	permission kmsg.ACLPermissionType
}

func (f aclFilter) matches(a ACL) bool {
	if f.rt != kmsg.ACLResourceTypeAny && f.rt != a.ResourceType {
		return false
	}
	switch f.pattern {
	case kmsg.ACLResourcePatternTypeAny:
		if f.name != nil && *f.name != a.Name {
			return false
		}
	case kmsg.ACLResourcePatternTypeMatch:
		if f.name != nil && !a.matchesName(*f.name) {
			return false
		}
	default:
		if f.pattern != a.Pattern || f.name != nil && *f.name != a.Name {
			return false
		}
	}
	return (f.principal == nil || *f.principal == a.Principal) &&
		(f.host == nil || *f.host == a.Host) &&
		(f.op == kmsg.ACLOperationAny || f.op == a.Operation) &&
		(f.permission == kmsg.ACLPermissionTypeAny || f.permission == a.Permission)
}

// errNoACLFile refuses changes to ACLs that could not be kept.
var errNoACLFile = errors.New("ACLs can only be changed with an ACL file (--listener-acl-file)")

// create adds acls (a duplicate is kept once) and saves the file.
func (a *Authorizer) create(acls []ACL) error {
	if a.cfg.File == "" {
		return errNoACLFile
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	next := slices.Clone(a.acls)
	for _, acl := range acls {
		if !slices.Contains(next, acl) {
			next = append(next, acl)
		}
	}
	if err := writeACLs(a.cfg.File, next); err != nil {
		return err
	}
	a.acls = next
	return nil
}

// delete removes every ACL a filter matches, saves the file and returns
// what each filter removed.
func (a *Authorizer) delete(filters []aclFilter) ([][]ACL, error) {
	if a.cfg.File == "" {
		return nil, errNoACLFile
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	removed := make([][]ACL, len(filters))
	var next []ACL
	for _, acl := range a.acls {
		keep := true
		for i, f := range filters {
			if f.matches(acl) {
				removed[i] = append(removed[i], acl)
				keep = false
			}
		}
		if keep {
			next = append(next, acl)
		}
	}
	if err := writeACLs(a.cfg.File, next); err != nil {
		return nil, err
	}
	a.acls = next
	return removed, nil
}
