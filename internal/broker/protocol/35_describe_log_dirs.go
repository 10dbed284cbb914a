package protocol

import (
	"path/filepath"
	"slices"
	"syscall"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleDescribeLogDirs reports the one log directory, the broker's data
// directory: each partition's bytes on disk (of the partitions asked
// for, or all when the request names none), and from v4 the file
// system's total and free bytes.
func (s *Server) handleDescribeLogDirs(req *kmsg.DescribeLogDirsRequest, resp *kmsg.DescribeLogDirsResponse) {
	d := kmsg.NewDescribeLogDirsResponseDir()
	d.Dir, _ = filepath.Abs(s.b.Dir())
	d.TotalBytes, d.UsableBytes = -1, -1
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.Dir, &st); err == nil {
		d.TotalBytes, d.UsableBytes = int64(st.Blocks)*int64(st.Bsize), int64(st.Bavail)*int64(st.Bsize)
	}
	want := func(topic string, part int32) bool {
		if req.Topics == nil {
			return true
		}
		for _, t := range req.Topics {
			if t.Topic == topic && slices.Contains(t.Partitions, part) {
				return true
			}
		}
		return false
	}
	for _, ti := range s.b.Topics() {
		t := kmsg.NewDescribeLogDirsResponseDirTopic()
		t.Topic = ti.Name
		for _, pi := range ti.Partitions {
			if !want(ti.Name, pi.Partition) {
				continue
			}
			p := kmsg.NewDescribeLogDirsResponseDirTopicPartition()
			p.Partition, p.Size = pi.Partition, pi.Bytes
			t.Partitions = append(t.Partitions, p)
		}
		if len(t.Partitions) > 0 {
			d.Topics = append(d.Topics, t)
		}
	}
	resp.Dirs = append(resp.Dirs, d)
}
