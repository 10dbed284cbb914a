package protocol

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The ACL APIs (DescribeAcls 29, CreateAcls 30, DeleteAcls 31) manage the
// Authorizer's ACLs so that kafka-acls.sh, kadm and other tools work.
// Without an Authorizer they answer SECURITY_DISABLED. Describing needs
// Describe on the cluster, changing needs Alter on the cluster: an
// explicit ACL or a super user, never the allow-by-default.

func (s *Server) canCluster(c *conn, op kmsg.ACLOperation) bool {
	return s.can(c, op, kmsg.ACLResourceTypeCluster, clusterName)
}

func (s *Server) handleDescribeACLs(c *conn, req *kmsg.DescribeACLsRequest, resp *kmsg.DescribeACLsResponse) {
	switch {
	case s.authz == nil:
		resp.ErrorCode = kerr.SecurityDisabled.Code
		return
	case !s.canCluster(c, kmsg.ACLOperationDescribe):
		resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
		return
	}
	pattern := req.ResourcePatternType
	if req.Version == 0 {
		pattern = kmsg.ACLResourcePatternTypeLiteral
	}
	f := aclFilter{rt: req.ResourceType, name: req.ResourceName, pattern: pattern, principal: req.Principal, host: req.Host, op: req.Operation, permission: req.PermissionType}
	type resKey struct {
		rt      kmsg.ACLResourceType
		name    string
		pattern kmsg.ACLResourcePatternType
	}
	at := map[resKey]int{}
	for _, a := range s.authz.ACLs() {
		if !f.matches(a) {
			continue
		}
		k := resKey{a.ResourceType, a.Name, a.Pattern}
		i, ok := at[k]
		if !ok {
			r := kmsg.NewDescribeACLsResponseResource()
			r.ResourceType, r.ResourceName, r.ResourcePatternType = a.ResourceType, a.Name, a.Pattern
			resp.Resources = append(resp.Resources, r)
			i = len(resp.Resources) - 1
			at[k] = i
		}
		e := kmsg.NewDescribeACLsResponseResourceACL()
		e.Principal, e.Host, e.Operation, e.PermissionType = a.Principal, a.Host, a.Operation, a.Permission
		resp.Resources[i].ACLs = append(resp.Resources[i].ACLs, e)
	}
}

func (s *Server) handleCreateACLs(c *conn, req *kmsg.CreateACLsRequest, resp *kmsg.CreateACLsResponse) {
	code, msg := int16(0), ""
	switch {
	case s.authz == nil:
		code = kerr.SecurityDisabled.Code
	case !s.canCluster(c, kmsg.ACLOperationAlter):
		code = kerr.ClusterAuthorizationFailed.Code
	}
	var acls []ACL
	var idx []int
	for i, cr := range req.Creations {
		r := kmsg.NewCreateACLsResponseResult()
		resp.Results = append(resp.Results, r)
		if code != 0 {
			resp.Results[i].ErrorCode = code
			continue
		}
		pattern := cr.ResourcePatternType
		if req.Version == 0 {
			pattern = kmsg.ACLResourcePatternTypeLiteral
		}
		a := ACL{ResourceType: cr.ResourceType, Name: cr.ResourceName, Pattern: pattern, Principal: cr.Principal, Host: cr.Host, Operation: cr.Operation, Permission: cr.PermissionType}
		if err := a.valid(); err != nil {
			resp.Results[i].ErrorCode = kerr.InvalidRequest.Code
			m := err.Error()
			resp.Results[i].ErrorMessage = &m
			continue
		}
		acls = append(acls, a)
		idx = append(idx, i)
	}
	if len(acls) > 0 {
		if err := s.authz.create(acls); err != nil {
			code, msg = kerr.UnknownServerError.Code, err.Error()
			if err == errNoACLFile {
				code = kerr.SecurityDisabled.Code
			}
			for _, i := range idx {
				resp.Results[i].ErrorCode, resp.Results[i].ErrorMessage = code, &msg
			}
		} else {
			s.log.Info("created ACLs", "by", c.principal, "acls", fmt.Sprint(acls))
		}
	}
}

func (s *Server) handleDeleteACLs(c *conn, req *kmsg.DeleteACLsRequest, resp *kmsg.DeleteACLsResponse) {
	code := int16(0)
	switch {
	case s.authz == nil:
		code = kerr.SecurityDisabled.Code
	case !s.canCluster(c, kmsg.ACLOperationAlter):
		code = kerr.ClusterAuthorizationFailed.Code
	}
	filters := make([]aclFilter, len(req.Filters))
	for i, rf := range req.Filters {
		pattern := rf.ResourcePatternType
		if req.Version == 0 {
			pattern = kmsg.ACLResourcePatternTypeLiteral
		}
		filters[i] = aclFilter{rt: rf.ResourceType, name: rf.ResourceName, pattern: pattern, principal: rf.Principal, host: rf.Host, op: rf.Operation, permission: rf.PermissionType}
	}
	var removed [][]ACL
	var msg *string
	if code == 0 && len(filters) > 0 {
		var err error
		if removed, err = s.authz.delete(filters); err != nil {
			code = kerr.UnknownServerError.Code
			if err == errNoACLFile {
				code = kerr.SecurityDisabled.Code
			}
			m := err.Error()
			msg = &m
		}
	}
	for i := range req.Filters {
		r := kmsg.NewDeleteACLsResponseResult()
		r.ErrorCode, r.ErrorMessage = code, msg
		if code == 0 {
			for _, a := range removed[i] {
				m := kmsg.NewDeleteACLsResponseResultMatchingACL()
				m.ResourceType, m.ResourceName, m.ResourcePatternType = a.ResourceType, a.Name, a.Pattern
				m.Principal, m.Host, m.Operation, m.PermissionType = a.Principal, a.Host, a.Operation, a.Permission
				r.MatchingACLs = append(r.MatchingACLs, m)
			}
			if len(removed[i]) > 0 {
				s.log.Info("deleted ACLs", "by", c.principal, "acls", fmt.Sprint(removed[i]))
			}
		}
		resp.Results = append(resp.Results, r)
	}
}
