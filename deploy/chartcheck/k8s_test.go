package chartcheck

import (
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
)

// strictDecoder decodes a manifest into the typed object its apiVersion
// and kind name; an unknown field, a duplicate field or a wrong type is
// an error.
var strictDecoder = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// manifests is the set of objects of one rendering or file set.
type manifests struct {
	objects  []runtime.Object
	services []*corev1.Service
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeAll splits a YAML stream into documents and decodes each strictly.
func decodeAll(t *testing.T, where string, stream []byte) *manifests {
	t.Helper()
	m := &manifests{}
	for i, doc := range docSeparator.Split(string(stream), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		obj, gvk, err := strictDecoder.Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Errorf("%s, document %d: %v\n%s", where, i, err, doc)
			continue
		}
		if gvk.Group == "" && gvk.Kind == "List" {
			t.Errorf("%s, document %d: a List", where, i)
			continue
		}
		m.objects = append(m.objects, obj)
		if s, ok := obj.(*corev1.Service); ok {
			m.services = append(m.services, s)
		}
	}
	if len(m.objects) == 0 {
		t.Fatalf("%s: no objects", where)
	}
	return m
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// workload is a pod template with what owns it.
type workload struct {
	where    string
	replicas int32
	pod      corev1.PodTemplateSpec
	claims   map[string]bool // volumeClaimTemplates by name
}

func (m *manifests) workloads() []workload {
	var ws []workload
	for _, o := range m.objects {
		switch o := o.(type) {
		case *appsv1.StatefulSet:
			w := workload{where: "StatefulSet " + o.Name, replicas: 1, pod: o.Spec.Template, claims: map[string]bool{}}
			if o.Spec.Replicas != nil {
				w.replicas = *o.Spec.Replicas
			}
			for _, c := range o.Spec.VolumeClaimTemplates {
				w.claims[c.Name] = true
			}
			ws = append(ws, w)
		case *appsv1.Deployment:
			w := workload{where: "Deployment " + o.Name, replicas: 1, pod: o.Spec.Template}
			if o.Spec.Replicas != nil {
				w.replicas = *o.Spec.Replicas
			}
			ws = append(ws, w)
		case *batchv1.Job:
			ws = append(ws, workload{where: "Job " + o.Name, replicas: 1, pod: o.Spec.Template})
		}
	}
	return ws
}

// facts are what a check found, for the caller to assert on.
type facts struct {
	runContainers int
	embedded      int
	kafkaSink     int
	readiness     []string // readiness paths of relay run containers
	args          [][]string
}

// check asserts the properties every manifest of the relay must have and
// returns what it saw.
func (m *manifests) check(t *testing.T, where string) facts {
	t.Helper()
	var f facts
	ws := m.workloads()
	if len(ws) == 0 {
		t.Fatalf("%s: no workload", where)
	}
	for _, w := range ws {
		f.add(m.checkWorkload(t, where+": "+w.where, w))
	}
	for _, s := range m.services {
		m.checkService(t, where+": Service "+s.Name, s, ws)
	}
	for _, o := range m.objects {
		pdb, ok := o.(*policyv1.PodDisruptionBudget)
		if !ok {
			continue
		}
		if pdb.Spec.Selector == nil {
			t.Errorf("%s: PodDisruptionBudget %s selects nothing", where, pdb.Name)
			continue
		}
		for _, w := range ws {
			if selects(pdb.Spec.Selector.MatchLabels, w.pod.Labels) && strings.HasPrefix(w.where, "Job") {
				t.Errorf("%s: PodDisruptionBudget %s selects the pods of %s", where, pdb.Name, w.where)
			}
		}
	}
	return f
}

func (f *facts) add(g facts) {
	f.runContainers += g.runContainers
	f.embedded += g.embedded
	f.kafkaSink += g.kafkaSink
	f.readiness = append(f.readiness, g.readiness...)
	f.args = append(f.args, g.args...)
}

func (m *manifests) checkWorkload(t *testing.T, where string, w workload) facts {
	t.Helper()
	var f facts
	spec := w.pod.Spec
	psc := spec.SecurityContext
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: the pod's seccomp profile is not RuntimeDefault", where)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	for _, c := range spec.Containers {
		cw := where + ", container " + c.Name
		checkContainerSecurity(t, cw, psc, c)
		for _, e := range c.Env {
			if strings.Contains(e.Value, "postgres://") || strings.Contains(e.Value, "postgresql://") {
				t.Errorf("%s: %s holds a database URL inline; it must come from a Secret", cw, e.Name)
			}
		}
		for _, a := range append(append([]string{}, c.Command...), c.Args...) {
			if strings.Contains(a, "postgres://") || strings.Contains(a, "postgresql://") || strings.HasPrefix(a, "--database-url") || strings.Contains(a, "sasl-password") {
				t.Errorf("%s: a secret on the command line: %q", cw, a)
			}
		}
		for _, m := range c.VolumeMounts {
			if _, ok := volumes[m.Name]; !ok && !w.claims[m.Name] {
				t.Errorf("%s: mounts %s, which is no volume of the pod", cw, m.Name)
			}
		}
		if !strings.Contains(c.Image, "relay") {
			continue
		}
		var env []string
		var dbFromSecret bool
		for _, e := range c.Env {
			env = append(env, e.Name)
			if e.Name == "RELAY_DATABASE_URL" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				dbFromSecret = true
			}
		}
		if !dbFromSecret {
			t.Errorf("%s: RELAY_DATABASE_URL does not come from a Secret", cw)
		}
		path, flags := checkRelayArgs(t, cw, c.Args, env)
		if len(path) == 0 || path[0] != "run" {
			continue
		}
		f.runContainers++
		f.args = append(f.args, c.Args)
		if c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Memory().IsZero() {
			t.Errorf("%s: no memory request and limit", cw)
		}
		shutdown := 30 * time.Second
		if v, ok := flags["shutdown-timeout"]; ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Errorf("%s: --shutdown-timeout %q: %v", cw, v, err)
			}
			shutdown = d
		}
		grace := int64(30)
		if spec.TerminationGracePeriodSeconds != nil {
			grace = *spec.TerminationGracePeriodSeconds
		}
		if time.Duration(grace)*time.Second <= shutdown {
			t.Errorf("%s: terminationGracePeriodSeconds %d is not longer than --shutdown-timeout %s", cw, grace, shutdown)
		}
		httpPort := listenPort(t, cw, "http-addr", flags["http-addr"], true)
		checkProbe(t, cw, "liveness", c, c.LivenessProbe, httpPort, "/healthz")
		if c.StartupProbe != nil {
			checkProbe(t, cw, "startup", c, c.StartupProbe, httpPort, "/healthz")
		}
		if c.ReadinessProbe != nil {
			want := "/readyz"
			if w.replicas > 1 {
				// A standby is never ready: a pod of several must not
				// ask /readyz, or rollouts wait for it forever.
				want = "/healthz"
			}
			checkProbe(t, cw, "readiness", c, c.ReadinessProbe, httpPort, want)
			f.readiness = append(f.readiness, c.ReadinessProbe.HTTPGet.Path)
		}
		if tmp := mountedAt(c, "/tmp"); tmp == "" || volumes[tmp].EmptyDir == nil {
			t.Errorf("%s: /tmp is not an emptyDir (the root filesystem is read-only)", cw)
		}
		if flags["sink"] == "kafka" {
			f.kafkaSink++
			if flags["kafka-brokers"] == "" {
				t.Errorf("%s: --sink kafka without --kafka-brokers", cw)
			}
			continue
		}
		f.embedded++
		if w.replicas > 1 {
			t.Errorf("%s: %d replicas of the embedded broker", cw, w.replicas)
		}
		dataDir := flags["data-dir"]
		if dataDir == "" {
			t.Errorf("%s: no --data-dir", cw)
		}
		vol := mountedAt(c, dataDir)
		switch {
		case vol == "":
			t.Errorf("%s: --data-dir %s is on no volume", cw, dataDir)
		case w.claims[vol]:
		case volumes[vol].PersistentVolumeClaim != nil:
		default:
			t.Errorf("%s: --data-dir %s is on volume %s, not a persistent volume claim", cw, dataDir, vol)
		}
		kafkaPort := listenPort(t, cw, "kafka-addr", flags["kafka-addr"], true)
		if p := containerPort(c, "kafka"); p != kafkaPort {
			t.Errorf("%s: container port kafka is %d, --kafka-addr listens on %d", cw, p, kafkaPort)
		}
		adv := flags["kafka-advertised-addr"]
		if adv == "" {
			t.Errorf("%s: no --kafka-advertised-addr: clients would be told the pod's address", cw)
			continue
		}
		m.checkAdvertised(t, cw, adv, w, kafkaPort)
	}
	if f.runContainers > 1 {
		t.Errorf("%s: %d relays in one pod", where, f.runContainers)
	}
	return f
}

func checkContainerSecurity(t *testing.T, where string, psc *corev1.PodSecurityContext, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	nonRoot := psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot
	if sc != nil && sc.RunAsNonRoot != nil {
		nonRoot = *sc.RunAsNonRoot
	}
	if !nonRoot {
		t.Errorf("%s: not runAsNonRoot", where)
	}
	if (psc != nil && psc.RunAsUser != nil && *psc.RunAsUser == 0) || (sc != nil && sc.RunAsUser != nil && *sc.RunAsUser == 0) {
		t.Errorf("%s: runs as UID 0", where)
	}
	if sc == nil {
		t.Errorf("%s: no securityContext", where)
		return
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: root filesystem not read-only", where)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: allowPrivilegeEscalation is not false", where)
	}
	if sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) > 0 {
		t.Errorf("%s: capabilities are not drop [ALL] with none added", where)
	}
}

// listenPort is the port of a relay listener flag's host:port; it must
// listen on every interface to be reached from outside the pod.
func listenPort(t *testing.T, where, flag, addr string, everyInterface bool) int32 {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: --%s %q: %v", where, flag, addr, err)
		return 0
	}
	if everyInterface && host != "0.0.0.0" && host != "" && host != "::" {
		t.Errorf("%s: --%s %s is not reachable from outside the pod", where, flag, addr)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Errorf("%s: --%s %q: port: %v", where, flag, addr, err)
	}
	return int32(p)
}

func containerPort(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

// resolvePort is a probe's or Service's target port as a number.
func resolvePort(c corev1.Container, p intstr.IntOrString) int32 {
	if p.Type == intstr.String {
		return containerPort(c, p.StrVal)
	}
	return p.IntVal
}

func checkProbe(t *testing.T, where, kind string, c corev1.Container, p *corev1.Probe, httpPort int32, path string) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("%s: no %s probe over HTTP", where, kind)
		return
	}
	if p.HTTPGet.Path != path {
		t.Errorf("%s: %s probe asks %s, want %s", where, kind, p.HTTPGet.Path, path)
	}
	if got := resolvePort(c, p.HTTPGet.Port); got != httpPort || got == 0 {
		t.Errorf("%s: %s probe asks port %s (%d), --http-addr listens on %d", where, kind, p.HTTPGet.Port.String(), got, httpPort)
	}
}

// mountedAt is the volume holding path in c: the longest mount path that
// is path or one of its parents.
func mountedAt(c corev1.Container, path string) string {
	best, name := -1, ""
	for _, m := range c.VolumeMounts {
		mp := strings.TrimSuffix(m.MountPath, "/")
		if path == mp || strings.HasPrefix(path, mp+"/") {
			if len(mp) > best {
				best, name = len(mp), m.Name
			}
		}
	}
	return name
}

// checkAdvertised: an advertised cluster address names a Service of these
// manifests that reaches the listener on the advertised port.
func (m *manifests) checkAdvertised(t *testing.T, where, adv string, w workload, kafkaPort int32) {
	t.Helper()
	host, port, err := net.SplitHostPort(adv)
	if err != nil {
		t.Errorf("%s: --kafka-advertised-addr %q: %v", where, adv, err)
		return
	}
	if !strings.HasSuffix(host, ".svc.cluster.local") && !strings.HasSuffix(host, ".svc") {
		return // an address outside the cluster (a load balancer's name)
	}
	name := strings.Split(host, ".")[0]
	for _, s := range m.services {
		if s.Name != name {
			continue
		}
		if !selects(s.Spec.Selector, w.pod.Labels) {
			t.Errorf("%s: advertised Service %s does not select this pod", where, name)
		}
		for _, p := range s.Spec.Ports {
			if strconv.Itoa(int(p.Port)) == port {
				var relay corev1.Container
				for _, c := range w.pod.Spec.Containers {
					if containerPort(c, "kafka") != 0 {
						relay = c
					}
				}
				if got := resolvePort(relay, p.TargetPort); got != kafkaPort {
					t.Errorf("%s: Service %s port %s goes to %d, the listener is on %d", where, name, port, got, kafkaPort)
				}
				if !s.Spec.PublishNotReadyAddresses {
					t.Logf("%s: Service %s drops the listener while /readyz is red", where, name)
				}
				return
			}
		}
		t.Errorf("%s: advertised Service %s has no port %s", where, name, port)
		return
	}
	t.Errorf("%s: --kafka-advertised-addr %s names no Service of these manifests", where, adv)
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkService: a Service selects a workload's pods, and each target port
// names one of their container ports.
func (m *manifests) checkService(t *testing.T, where string, s *corev1.Service, ws []workload) {
	t.Helper()
	for _, w := range ws {
		if selects(s.Spec.Selector, w.pod.Labels) && strings.HasPrefix(w.where, "Job") {
			t.Errorf("%s: selects the pods of %s", where, w.where)
		}
	}
	for _, w := range ws {
		if !selects(s.Spec.Selector, w.pod.Labels) || strings.HasPrefix(w.where, "Job") {
			continue
		}
		for _, p := range s.Spec.Ports {
			found := false
			for _, c := range w.pod.Spec.Containers {
				if resolvePort(c, p.TargetPort) != 0 && (p.TargetPort.Type == intstr.String || hasPort(c, p.TargetPort.IntVal)) {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: port %s targets %s, no container port of %s", where, p.Name, p.TargetPort.String(), w.where)
			}
		}
		return
	}
	t.Errorf("%s: selects no workload's pods", where)
}

func hasPort(c corev1.Container, n int32) bool {
	for _, p := range c.Ports {
		if p.ContainerPort == n {
			return true
		}
	}
	return false
}
