import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l); b=r['req'] or {}
    print(r['method'], r['path'], r['status'], 'tools:', [t['function']['name'] for t in b.get('tools',[])], 'msgs:', [m['role'] for m in b.get('messages',[])], {k:v for k,v in b.items() if k not in ('messages','tools')})
    resp=r['resp']; content=''; calls=[]
    for line in resp.splitlines():
        if line.startswith('data: ') and line[6:].strip()!='[DONE]':
            try: ev=json.loads(line[6:])
            except: continue
            for c in ev.get('choices',[]):
                d=c.get('delta',{}); content+=d.get('content') or ''
                for tc in d.get('tool_calls') or []: calls.append(tc)
    print('  content:', content[:400].replace('\n','\\n')); print('  calls:', json.dumps(calls)[:600])
