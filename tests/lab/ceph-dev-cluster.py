# The Python half of tests/lab/ceph-dev-cluster: cluster queries through the rados and cephfs
# bindings, without the slow CLI. That script runs it as
#     /usr/bin/python3 - CONF COMMAND [ARGS...] < ceph-dev-cluster.py
# (on stdin, so that with --release 18|20 the release's own python3 runs it inside its root
# filesystem, where this file is not). COMMAND: setup, wait, active, standby-replay, fail, probe,
# status.
import errno, json, sys, time

conf, cmd, args = sys.argv[1], sys.argv[2], sys.argv[3:]
FS = "cephfs"

def fail(msg, code=1):
    print(msg, file=sys.stderr)
    sys.exit(code)

try:
    import rados
except ImportError as e:
    fail("cannot import the rados module (%s): install python3-rados" % e)

def connect(timeout=20):
    r = rados.Rados(conffile=conf, rados_id="admin")
    try:
        r.connect(timeout=timeout)
    except Exception as e:
        fail("cannot reach the monitor (%s); see the mon log under %s" % (e, conf.rsplit("/", 1)[0] + "/log"))
    return r

def mon(r, **kw):
    ret, out, outs = r.mon_command(json.dumps(dict(kw, format="json")), b"", timeout=20)
    return ret, out, outs

def mon_ok(r, **kw):
    ret, out, outs = mon(r, **kw)
    if ret != 0:
        fail("'%s' failed: %s (%s)" % (kw["prefix"], errno.errorcode.get(-ret, ret), outs))
    return json.loads(out) if out else None

def fs_state(r):
    d = mon_ok(r, prefix="fs dump")
    active, others = None, []
    for fs in d.get("filesystems", []):
        m = fs["mdsmap"]
        if m.get("fs_name") != FS:
            continue
        for info in m.get("info", {}).values():
            if info.get("rank") == 0 and info.get("state") == "up:active":
                active = info
            else:
                others.append(info)
    standbys = [s for s in d.get("standbys", []) if s.get("state") == "up:standby"]
    # a standby-replay daemon follows rank 0's journal and stands in like a standby
    standbys += [s for s in others if s.get("state") == "up:standby-replay"]
    others = [s for s in others if s.get("state") != "up:standby-replay"]
    return active, standbys, others

def opts(a):
    o = {}
    it = iter(a)
    for k in it:
        o[k.lstrip("-")] = next(it)
    return o

def daemon_alive(pid):
    # A daemon of this cluster still runs as pid: the process exists, is no zombie, and its
    # command line names our conf. An MDS that the monitors removed from the map respawns by
    # exec'ing itself under the same pid; while the kernel swaps the image, /proc/PID/cmdline
    # reads empty or fails: that is alive too. A pid reused by another program is not.
    try:
        with open("/proc/%s/stat" % pid, "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state == b"Z":
        return False
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as f:
            cmdline = f.read()
    except OSError:
        return True
    return not cmdline or conf.encode() in cmdline


if cmd == "setup":
    # osd id 0 + pools + the file system (the mon accepts them before the OSD is up)
    osd_uuid = args[0]
    r = connect()
    mon_ok(r, prefix="osd new", uuid=osd_uuid, id=0)
    for pool in ("cephfs_metadata", "cephfs_data"):
        mon_ok(r, prefix="osd pool create", pool=pool, pg_num=8, pgp_num=8)
    mon_ok(r, prefix="fs new", fs_name=FS, metadata="cephfs_metadata", data="cephfs_data")
    # the always-on mgr modules we disable would report "failed" (HEALTH_ERR)
    for code in ["MGR_MODULE_ERROR"] + args[1:]:
        mon_ok(r, prefix="health mute", code=code, sticky=True)
    r.shutdown()

elif cmd == "wait":
    # wait until rank 0 is up:active [with a gid other than --not-gid] [and N standbys]
    # [and the mgr answers a volumes command]; print "name gid" of the active MDS.
    o = opts(args)
    not_gid = int(o.get("not-gid", "-1"))
    want_standbys = int(o.get("standbys", "0"))
    want_mgr = o.get("mgr", "0") == "1"
    deadline = time.monotonic() + float(o.get("timeout", "60"))
    watch = [w.split("=", 1) for w in o.get("watch", "").split()]
    r = connect()
    last = "no answer yet"
    while True:
        for name, pid in watch:
            # twice, a moment apart: a respawning MDS is seen alive again at once
            if not daemon_alive(pid) and (time.sleep(0.2) or not daemon_alive(pid)):
                fail("%s (pid %s) exited" % (name, pid))
        active, standbys, others = fs_state(r)
        ok = active is not None and active["gid"] != not_gid and len(standbys) >= want_standbys
        if ok and want_mgr:
            ret, out, outs = mon(r, prefix="mgr stat")
            st = json.loads(out) if ret == 0 and out else {}
            if not st.get("available"):
                ok, last = False, "mgr not available"
            else:
                ret, out, outs = r.mgr_command(json.dumps({"prefix": "fs subvolume ls", "vol_name": FS}), b"", timeout=20)
                if ret != 0:
                    ok, last = False, "mgr volumes module not ready: %s" % outs.strip()
        elif not ok:
            last = "rank 0: %s; standbys: %s; other mds: %s" % (
                "%s (gid %d)" % (active["name"], active["gid"]) if active else "not active",
                [s["name"] for s in standbys] or "none",
                ["%s %s" % (i["name"], i["state"]) for i in others] or "none")
        if ok:
            print("%s %d" % (active["name"], active["gid"]))
            break
        if time.monotonic() > deadline:
            fail("not ready after %ss: %s" % (o.get("timeout", "60"), last))
        time.sleep(0.05)
    r.shutdown()

elif cmd == "active":
    r = connect()
    active, standbys, others = fs_state(r)
    if active is None:
        fail("no active MDS for rank 0")
    print("%s %d %d" % (active["name"], active["gid"], len(standbys)))
    r.shutdown()

elif cmd == "standby-replay":
    # let the standby follow rank 0's journal; wait until it does
    r = connect()
    mon_ok(r, prefix="fs set", fs_name=FS, var="allow_standby_replay", val="true")
    deadline = time.monotonic() + 60
    while True:
        active, standbys, others = fs_state(r)
        if any(s.get("state") == "up:standby-replay" for s in standbys):
            break
        if time.monotonic() > deadline:
            fail("no MDS became up:standby-replay within 60 s")
        time.sleep(0.1)
    r.shutdown()

elif cmd == "fail":
    r = connect()
    mon_ok(r, prefix="mds fail", role_or_gid=args[0])
    r.shutdown()

elif cmd == "probe":
    # a real CephFS client: mount with libcephfs, stat and list the root, statfs,
    # and with --write create and remove a directory (journal + OSD writes).
    try:
        import cephfs
    except ImportError as e:
        fail("cannot import the cephfs module (%s): install python3-cephfs" % e)
    write = "--write" in args
    fs = cephfs.LibCephFS(conffile=conf, auth_id="admin")
    try:
        fs.mount(filesystem_name=FS.encode())
        fs.stat("/")
        d = fs.opendir("/")
        while fs.readdir(d):
            pass
        fs.closedir(d)
        fs.statfs("/")
        if write:
            p = "/.ceph-dev-cluster-probe.%d" % time.time_ns()
            fs.mkdir(p, 0o755)
            fs.rmdir(p)
        fs.unmount()
    except Exception as e:
        fail("CephFS client probe failed: %s" % e)
    finally:
        fs.shutdown()

elif cmd == "status":
    r = connect(timeout=5)
    ret, out, outs = mon(r, prefix="health")
    h = json.loads(out) if ret == 0 and out else {}
    print("health: %s" % h.get("status", "unknown"))
    for k, v in sorted(h.get("checks", {}).items()):
        print("  %s: %s" % (k, v.get("summary", {}).get("message", "")))
    active, standbys, others = fs_state(r)
    print("mds rank 0: %s" % ("%s (gid %d) up:active" % (active["name"], active["gid"]) if active else "NOT ACTIVE"))
    for i in others:
        print("mds %s: %s" % (i["name"], i["state"]))
    for s in standbys:
        print("mds %s: %s" % (s["name"], s.get("state", "up:standby")[3:]))
    st = mon_ok(r, prefix="osd stat")
    print("osds: %s up, %s in" % (st.get("num_up_osds"), st.get("num_in_osds")))
    ret, out, outs = mon(r, prefix="mgr stat")
    if ret == 0 and out:
        st = json.loads(out)
        print("mgr: %s" % ((st.get("active_name") or "-") + (" available" if st.get("available") else " not available")))
    r.shutdown()
    sys.exit(0 if active else 1)

else:
    fail("unknown helper command %s" % cmd)
