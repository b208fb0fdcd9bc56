package gate

import (
	"fmt"
	"slices"

	"google.golang.org/grpc"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/auth"
)

// Need is what a method asks of its caller.
type Need struct {
	// Open methods need no credential at all (health probes).
	Open bool
	// Member methods are for the cluster's own nodes (the cluster token,
	// a member certificate) only.
	Member bool
	// Role is the role the caller must hold; 0: any authenticated
	// identity. A cluster member holds every role.
	Role auth.Role
}

// Allows says why id may not call a method that needs n; nil if it may.
func (n Need) Allows(id auth.Identity) error {
	switch {
	case n.Open || id.Member:
		return nil
	case n.Member:
		return fmt.Errorf("%w: only members of the cluster may call this", auth.ErrDenied)
	case n.Role != 0 && !id.Can(n.Role):
		return fmt.Errorf("%w: it needs the %s role, and %s holds %q", auth.ErrDenied, auth.Roles(n.Role), id.User, id.Roles)
	}
	return nil
}

var (
	anyone   = Need{Open: true}
	signedIn = Need{}
	member   = Need{Member: true}
	reader   = Need{Role: auth.Read}
	writer   = Need{Role: auth.Write}
	operator = Need{Role: auth.Operate}
)

// Methods is what every gRPC method a node serves needs of its caller,
// by full method name. A method a server registers without an entry here
// is refused to everyone (and the daemon refuses to start with one).
var Methods = map[string]Need{
	// Cache: a tenant's blocks, bound to its namespaces by api/server.
	pb.Cache_Info_FullMethodName:          signedIn, // every client's first call
	pb.Cache_Put_FullMethodName:           writer,
	pb.Cache_Get_FullMethodName:           reader,
	pb.Cache_Lookup_FullMethodName:        reader,
	pb.Cache_Exists_FullMethodName:        reader,
	pb.Cache_LocateObjects_FullMethodName: reader,
	pb.Cache_Pin_FullMethodName:           reader,
	pb.Cache_Release_FullMethodName:       reader,
	pb.Cache_Stats_FullMethodName:         reader,
	pb.Cache_Evict_FullMethodName:         operator,
	pb.Cache_Warm_FullMethodName:          operator,

	// Cluster: what clients read of the cluster (members, where blocks
	// are, workers, planner decisions), what operators change, and what
	// only the members say to each other.
	pb.Cluster_Members_FullMethodName:              reader,
	pb.Cluster_Locate_FullMethodName:               reader,
	pb.Cluster_Sync_FullMethodName:                 writer,
	pb.Cluster_ListWorkers_FullMethodName:          reader,
	pb.Cluster_ListPlannerDecisions_FullMethodName: reader,
	pb.Cluster_Join_FullMethodName:                 operator,
	pb.Cluster_Remove_FullMethodName:               operator,
	pb.Cluster_RegisterWorker_FullMethodName:       operator,
	pb.Cluster_DeregisterWorker_FullMethodName:     operator,
	pb.Cluster_PutPlannerDecisions_FullMethodName:  operator,
	pb.Cluster_AckPlannerDecision_FullMethodName:   operator,
	pb.Cluster_Propose_FullMethodName:              member,
	pb.Cluster_Heartbeat_FullMethodName:            member,

	// Keyspace: one node's Redis keys, read by the others.
	pb.Keyspace_Get_FullMethodName:    member,
	pb.Keyspace_Stat_FullMethodName:   member,
	pb.Keyspace_Delete_FullMethodName: member,
	pb.Keyspace_Scan_FullMethodName:   member,
	pb.Keyspace_Len_FullMethodName:    member,
	pb.Keyspace_Flush_FullMethodName:  member,

	// Health is for probes, which carry no credential; reflection lists
	// the services and their messages, for grpcurl.
	"/grpc.health.v1.Health/Check":                                   anyone,
	"/grpc.health.v1.Health/Watch":                                   anyone,
	"/grpc.health.v1.Health/List":                                    anyone,
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      reader,
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": reader,
}

// Missing lists, sorted, the methods of services (a grpc.Server's
// GetServiceInfo) that Methods has no entry for.
func Missing(services map[string]grpc.ServiceInfo) []string {
	var out []string
	for name, svc := range services {
		for _, m := range svc.Methods {
			full := "/" + name + "/" + m.Name
			if _, ok := Methods[full]; !ok {
				out = append(out, full)
			}
		}
	}
	slices.Sort(out)
	return out
}
