--[[ stune's cli_filter: plain sbatch, salloc and srun get the partition's settings, as stune-sbatch sets them.

Placed beside slurm.conf by `stune-admin install --cli-filter`, with slurm.conf saying
CliFilterPlugins=cli_filter/lua. Slurm (22.05 and later) runs it inside sbatch, salloc and srun; it never
starts a process. What it applies per partition comes from the data file install renders from the profiles
through stune-sbatch's own plan (slurm_tune/clifilter/render.py): nothing here names a setting.

- sbatch with the default --export (ALL): the options (--requeue, --gpu-bind, ...) unless you gave your own;
  the environment is left to the TaskProlog, which sets it on each node for a job without STUNE_MANAGED when
  slurm.conf enables this filter (nodeenv/taskenv.py): sbatch reads any --export list, even ALL,NAME=value,
  as --get-user-env, and the node would load your login environment first.
- sbatch with your own --export list or NONE (sbatch loads your login environment then anyway), and srun
  starting a job: the environment as --export NAME=value items after yours. What the TaskProlog sets on each
  node (NCCL_IB_HCA narrowed to the ACTIVE ports, NCCL_SOCKET_IFNAME once it is up, the GID index, gloo's
  interface, MASTER_ADDR/PORT) and STUNE_MANAGED are left to it: --export cannot carry a value with a comma
  (an --export-file would replace the whole environment).
- salloc: the options; salloc has no --export, so each srun step inside the allocation gets the environment.
- srun inside a job that has stune's settings (STUNE_MANAGED, which the TaskProlog writes): nothing, at the
  cost of two getenv calls. A step in an allocation without them (salloc) gets the environment as above.

A value you set wins: your environment (with the default --export=ALL), your --export items and names; with
your own --export-file (the job's whole environment) nothing is added, and a note says so. STUNE_EXPLAIN=1
prints what it adds, keeps and leaves to the node, on stderr. An error inside the filter never stops a
submission: it says so in one line, and the job is submitted as Slurm alone would submit it (less any
setting the filter had not yet made).
]]

local DATA_PATH = "@STUNE_CLI_FILTER_DATA@"
local MANAGED_VAR = "STUNE_MANAGED"
local EXPLAIN_VAR = "STUNE_EXPLAIN"
local CHECKPOINT_VAR = "STUNE_CHECKPOINT_SIGNAL"
local MARK = "stune cli_filter: "

local data = nil        -- the rendered table, read once per process; false when it cannot be read
local data_error = nil

local function say(text)
  io.stderr:write(MARK .. text .. "\n")
end

local function set_on(name)
  local v = os.getenv(name)
  return v ~= nil and v ~= "" and v ~= "0"
end

local function load_data()
  if data ~= nil then
    return data
  end
  -- data only: the file runs in an empty environment and can call nothing (Lua 5.1: setfenv; 5.2 and later,
  -- which RPM builds of Slurm link, have no setfenv and take the environment as loadfile's third argument)
  local chunk, err
  if setfenv then
    chunk, err = loadfile(DATA_PATH)
    if chunk then
      setfenv(chunk, {})
    end
  else
    chunk, err = loadfile(DATA_PATH, "t", {})
  end
  if chunk then
    local ok, doc = pcall(chunk)
    if ok and type(doc) == "table" and doc.format == 1 and type(doc.partitions) == "table" then
      data = doc
      return data
    end
    err = ok and "not a stune cli_filter data file (format 1)" or tostring(doc)
  end
  data, data_error = false, tostring(err)
  return data
end

-- sbatch, salloc or srun: the process name, else (a renamed binary) which options Slurm says fit the command.
local function command_name(options)
  local fh = io.open("/proc/self/comm", "r")
  if fh then
    local name = fh:read("*l")
    fh:close()
    if name == "sbatch" or name == "salloc" or name == "srun" then
      return name
    end
  end
  local ok, file = pcall(function() return options["export-file"] end)
  local ok2, export = pcall(function() return options["export"] end)
  if ok and file ~= "invalid-context" then
    return "sbatch"
  elseif ok2 and export == "invalid-context" then
    return "salloc"
  end
  return "srun"
end

-- The user's --export, as sbatch splits it: mode all (default), list or none; names listed; NAME=value items.
local function parse_export(raw)
  local spec = {mode = "all", names = {}, assigned = {}, raw = raw}
  if raw == nil or raw == "invalid-context" then
    spec.raw = nil
    return spec
  end
  local mode = "list"
  for item in string.gmatch(raw, "[^,]+") do
    item = item:match("^%s*(.-)%s*$")
    local upper = item:upper()
    if upper == "ALL" then
      mode = "all"
    elseif upper == "NONE" then
      if mode ~= "all" then mode = "none" end
    elseif item:find("=", 1, true) then
      local name, value = item:match("^([^=]*)=(.*)$")
      spec.assigned[name] = value
    elseif item ~= "" then
      spec.names[item] = true
    end
  end
  if mode == "none" and (next(spec.names) ~= nil or next(spec.assigned) ~= nil) then
    mode = "list"
  end
  spec.mode = mode
  return spec
end

-- Variables a parent stune job set (a submission from inside a job): not the user's own.
local function parent_managed()
  local out = {}
  local text = os.getenv(MANAGED_VAR)
  if not text then
    return out
  end
  for item in string.gmatch(text, "[^,]+") do
    local name, eq, value = item:match("^%s*([^=]-)%s*(=?)(.*)$")
    if name and name ~= "" then
      if eq == "" then
        out[name] = true
      else
        value = value:gsub("%%2C", ","):gsub("%%25", "%%")
        out[name] = (os.getenv(name) == value)
      end
    end
  end
  return out
end

-- (value, where) when the job gets the user's own value of `name`; nil when stune may set it.
local function user_value(name, export, managed)
  if export.assigned[name] ~= nil then
    return export.assigned[name], "your --export"
  end
  local inherited = export.mode == "all" or export.names[name]
  local mine = os.getenv(name)
  if inherited and mine ~= nil and not managed[name] then
    return mine, "your environment"
  end
  return nil
end

local function option_value(options, key)
  local ok, value = pcall(function() return options[key] end)
  if not ok or value == "invalid-context" then
    return nil
  end
  return value
end

local function contains(list, value)
  for _, v in ipairs(list or {}) do
    if v == value then return true end
  end
  return false
end

-- The environment, as --export NAME=value items after yours. What the TaskProlog sets on each node (and checks
-- there) is left to it, and so is STUNE_MANAGED, which it writes: --export cannot carry a value with a comma.
local function apply_env(options, cmd, entry, explain)
  if cmd == "sbatch" and option_value(options, "export-file") ~= nil then
    say("note: your --export-file gives the job its environment: stune's variables are not added (put them in "
        .. "the file, or submit with stune-sbatch)")
    return
  end
  local export = parse_export(option_value(options, "export"))
  local managed = parent_managed()
  -- sbatch with the default --export: the TaskProlog sets the environment (any list would make sbatch load
  -- the user's login environment: SLURM_GET_USER_ENV)
  local to_node = cmd == "sbatch" and (export.raw == nil or export.raw:match("^%s*(.-)%s*$"):upper() == "ALL")
  local items = {}
  for _, item in ipairs(entry.env) do
    local value, where = user_value(item.name, export, managed)
    if export.assigned[item.name] == item.value then
      -- already there: a later component of a heterogeneous job starts from the first one's options
    elseif value ~= nil then
      if explain then
        say("  kept your " .. item.name .. "=" .. value .. " (" .. where .. "); stune would set " .. item.value
            .. "  [" .. item.source .. "]")
      end
    elseif item.node then
      if explain then
        say("  node " .. item.name .. ": set by the TaskProlog on each node (" .. item.value .. ", checked there)  ["
            .. item.source .. "]")
      end
    elseif to_node then
      if explain then
        say("  env " .. item.name .. "=" .. item.value .. "  <- " .. item.source)
      end
    elseif item.value:find(",", 1, true) then
      say("warning: " .. item.name .. "=" .. item.value .. " not set: --export cannot carry a value with a comma "
          .. "(stune-sbatch can)  [" .. item.source .. "]")
    else
      items[#items + 1] = item.name .. "=" .. item.value
      if explain then
        say("  env " .. item.name .. "=" .. item.value .. "  <- " .. item.source)
      end
    end
  end
  if to_node then
    if explain then
      say("  (set by the TaskProlog on each node, not as --export items: an --export list would make sbatch "
          .. "load your login environment)")
    end
    return
  end
  if #items == 0 then
    return
  end
  local list = table.concat(items, ",")
  if export.mode == "none" then
    options["export"] = list  -- NONE plus stune's variables: a list of them
  elseif export.raw == nil then
    options["export"] = "ALL," .. list
  else
    options["export"] = export.raw .. "," .. list
  end
  if explain then
    say("  (as --export=" .. options["export"] .. ")")
  end
end

local function apply_options(options, cmd, entry, explain)
  local opt_in = set_on(CHECKPOINT_VAR)
  for _, opt in ipairs(entry.options) do
    if contains(opt.commands, cmd) and (opt.when == "always" or opt_in) then
      local mine = nil
      for _, key in ipairs(opt.user_keys) do
        local value = option_value(options, key)
        if value ~= nil and value ~= "" and not contains(opt.unset_values, value) then
          mine = (value == key or value == "no-" .. key) and value or (key .. "=" .. value)
        end
      end
      local shown = opt.option .. (opt.value and ("=" .. opt.value) or "")
      if mine then
        if explain then
          say("  kept your --" .. mine .. "; stune would add " .. shown .. "  [" .. opt.source .. "]")
        end
      else
        options[opt.key] = opt.value or ""
        if explain then
          say("  option " .. shown .. "  <- " .. opt.source .. (opt.note ~= "" and ("; " .. opt.note) or ""))
        end
      end
    elseif explain and contains(opt.commands, cmd) then
      say("  not added: " .. opt.option .. "=" .. (opt.value or "") .. " (" .. CHECKPOINT_VAR .. "=1 adds it, as "
          .. "stune-sbatch --checkpoint-signal does: bash exits on an untrapped USR1)  [" .. opt.source .. "]")
    end
  end
end

local function pre_submit(options, offset)
  local in_job = os.getenv("SLURM_JOB_ID") ~= nil
  local managed = os.getenv(MANAGED_VAR) ~= nil
  local explain = set_on(EXPLAIN_VAR)
  local cmd = command_name(options)
  local step = cmd == "srun" and in_job  -- a step in an allocation: no new job
  if step and managed then  -- a step of a job that has stune's settings: nothing to do
    if explain then
      say("srun: a step of job " .. os.getenv("SLURM_JOB_ID") .. ", which has stune's settings (" .. MANAGED_VAR
          .. "): nothing added")
    end
    return
  end
  local doc = load_data()
  if not doc then
    say("warning: cannot read " .. DATA_PATH .. " (" .. tostring(data_error) .. "): no stune settings; the admin "
        .. "runs `stune-admin install --cli-filter`")
    return
  end
  local partition = option_value(options, "partition")
  local from = "--partition"
  if (partition == nil or partition == "") and step then
    -- the allocation's partition; never Slurm's default: the job runs where it runs
    partition = os.getenv("SLURM_JOB_PARTITION") or os.getenv("SLURM_JOB_PARTITION_HET_GROUP_0") or ""
    from = "the job's partition"
  elseif partition == nil or partition == "" then
    partition, from = doc.default_partition, "Slurm's default partition"
  end
  if partition == nil or partition == "" then
    if explain then say(cmd .. ": no partition named and none known: nothing added") end
    return
  end
  partition = partition:match("^%s*([^,]*)")
  local entry = doc.partitions[partition]
  if entry == nil then
    if explain then say(cmd .. ": partition " .. partition .. " has no stune profile: nothing added") end
    return
  end
  if explain then
    say(cmd .. (step and " (a step in job " .. os.getenv("SLURM_JOB_ID") .. ")" or "") .. ": partition "
        .. partition .. " (" .. from .. "), profile " .. entry.profile .. " (digest " .. entry.digest .. ", fabric "
        .. entry.fabric .. ")")
  end
  if cmd == "salloc" then
    if explain then
      say("  environment: salloc has no --export; each srun step in the allocation gets it")
    end
  else
    apply_env(options, cmd, entry, explain)
  end
  if not step then
    apply_options(options, cmd, entry, explain)
  end
  if explain then
    for _, note in ipairs(entry.notes) do
      say("  note " .. note.name .. ": " .. note.note .. "  [" .. note.source .. "]")
    end
  end
end

function slurm_cli_setup_defaults(options, early)
  return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, offset)
  local ok, err = pcall(pre_submit, options, offset)
  if not ok then
    say("warning: internal error: " .. tostring(err) .. "; submitting without (the rest of) stune's settings")
  end
  return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, jobid, stepid)
  return slurm.SUCCESS
end
